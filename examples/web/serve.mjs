// Serves the page, the two packages it runs (from node_modules) and an exported model on
// localhost, so that nothing is fetched from anywhere else:
//
//   npm ci --ignore-scripts
//   node serve.mjs EXPORT_DIR/onnx [--port 8000]
//
// then open the address it prints. --port 0 takes a free port.
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const METADATA_FILE = "model.json";
const CONTENT_TYPES = {
  ".html": "text/html; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".json": "application/json",
  ".wasm": "application/wasm",
};

function fail(message) {
  console.error(`serve.mjs: ${message}`);
  process.exit(2);
}

function parseArgs(argv) {
  const args = { port: 8000 };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--port") args.port = Number(argv[++i]);
    else if (args.directory === undefined) args.directory = argv[i];
    else fail(`unexpected argument ${argv[i]}`);
  }
  if (args.directory === undefined || !Number.isInteger(args.port)) {
    console.error("usage: node serve.mjs EXPORT_DIR/onnx [--port N]");
    process.exit(2);
  }
  return args;
}

// An export's onnx/ directory, given it or the export directory above it.
function findModel(directory) {
  for (const candidate of [directory, path.join(directory, "onnx")]) {
    if (fs.existsSync(path.join(candidate, METADATA_FILE))) return path.resolve(candidate);
  }
  fail(`${directory}: no exported ONNX model (${METADATA_FILE} not found)`);
}

function findPackage(name, subdirectory) {
  const directory = path.join(HERE, "node_modules", name, subdirectory);
  if (!fs.existsSync(directory)) fail(`${name} is not installed: run npm ci --ignore-scripts`);
  return directory;
}

// URL prefix -> the directory it is served from; the page lives at the root.
function routes(modelDirectory) {
  return [
    ["/model/", modelDirectory],
    ["/vendor/onnxruntime-web/", findPackage("onnxruntime-web", "dist")],
    ["/vendor/sentencepiece-js/", findPackage("@sctg/sentencepiece-js", "dist")],
    // What the page shares with the Node.js example (examples/shared).
    ["/shared/", path.join(HERE, "..", "shared")],
    ["/", path.join(HERE, "public")],
  ];
}

// The file a request names, or null: only files under a route's directory are served.
function resolveFile(table, pathname) {
  const [prefix, root] = table.find(([prefix]) => pathname.startsWith(prefix));
  const relative = pathname.slice(prefix.length) || "index.html";
  const file = path.resolve(root, relative);
  if (!file.startsWith(root + path.sep)) return null;
  return fs.statSync(file, { throwIfNoEntry: false })?.isFile() ? file : null;
}

function serve(table, request, response) {
  let pathname;
  try {
    pathname = decodeURIComponent(new URL(request.url, "http://localhost").pathname);
  } catch {
    pathname = null;
  }
  const file = pathname && resolveFile(table, pathname);
  if (!file) {
    response.writeHead(404, { "Content-Type": "text/plain" }).end("Not Found");
    return;
  }
  response.writeHead(200, {
    "Content-Type": CONTENT_TYPES[path.extname(file)] ?? "application/octet-stream",
    // Cross-origin isolation lets onnxruntime-web run its WebAssembly on several threads.
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
  });
  fs.createReadStream(file).pipe(response);
}

const args = parseArgs(process.argv.slice(2));
const modelDirectory = findModel(args.directory);
const table = routes(modelDirectory);
const server = http.createServer((request, response) => serve(table, request, response));
server.on("error", (error) => fail(error.message));
server.listen(args.port, "127.0.0.1", () => {
  const url = `http://127.0.0.1:${server.address().port}/`;
  console.log(`Serving ${modelDirectory} at ${url} (Ctrl+C to stop)`);
});
