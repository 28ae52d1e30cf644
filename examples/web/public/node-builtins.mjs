// @sctg/sentencepiece-js is written for Node.js: it imports the built-in modules `fs` (its
// load(path) reads the model with fs.readFileSync) and `buffer`. The page's import map points
// both here, where readFileSync returns the bytes of a URL fetched beforehand by fetchFile.
const fetchedFiles = new Map();

// The bytes at `url`, or an error naming it and the HTTP status.
export async function fetchBytes(url) {
  const response = await fetch(url);
  if (!response.ok) {
    throw new Error(`${new URL(url).pathname}: ${response.status} ${response.statusText}`);
  }
  return new Uint8Array(await response.arrayBuffer());
}

export async function fetchFile(url) {
  fetchedFiles.set(url, await fetchBytes(url));
}

export function readFileSync(url) {
  if (!fetchedFiles.has(url)) throw new Error(`${url} was not fetched`);
  return fetchedFiles.get(url);
}

// Only its base64 loader, which the page does not use, needs a Buffer.
export const Buffer = undefined;
