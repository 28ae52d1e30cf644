// What the page (examples/web) and Node.js (examples/node) share of an ONNX export of
// `python -m export`: reading its model.json, its vocabularies, the languages a request
// names, the search options it feeds and the text of a hypothesis. Each runtime passes its
// own onnxruntime package's Tensor and its own way of loading a file; this module imports
// nothing, so that both load it as it is.

// What every runtime reads from model.json; an export without one of them is too old.
export const REQUIRED_KEYS = [
  "model", "source_vocabulary", "target_vocabulary", "special_ids", "defaults",
  "option_dtypes", "max_source_length",
];

// `metadata` (model.json, read from `name`) with every key a runtime needs, or an error.
export function checkedMetadata(metadata, name) {
  const missing = REQUIRED_KEYS.filter((key) => !(key in metadata));
  if (missing.length > 0) {
    throw new Error(`${name}: no "${missing[0]}": export the model again (python -m export)`);
  }
  return metadata;
}

// `load(file)`; an error names the file (`name`: how the user knows it), so that a user with
// a damaged export, or several, knows which file is broken.
export async function loadFile(file, what, load, name = file) {
  try {
    return await load(file);
  } catch (error) {
    const reason = String(error?.message ?? error).split("\n")[0];
    throw new Error(reason.startsWith(name) ? reason : `${name}: cannot load the ${what} (${reason})`);
  }
}

// A SentencePiece processor loaded from `file`. The package ignores a failed load (its
// processor then encodes nothing): a probe tells.
export async function loadProcessor(SentencePieceProcessor, file) {
  const processor = new SentencePieceProcessor();
  await processor.load(file);
  if (processor.encodeIds("a").length === 0) throw new Error("not a SentencePiece model");
  return processor;
}

// The languages a request names, as model.json's `languages` describes the model
// (`multilingual.RequestLanguages` in Python, the rule every runtime follows; the cases of
// tests/fixtures/request_languages.json hold them all to it).
export class RequestLanguages {
  // `names`: what the runtime calls its two language arguments, for its error messages.
  constructor(languages = {}, names = { target: "target_language", source: "source_language" }) {
    this.tags = languages.tags ?? {};
    this.target = languages.target ?? null;
    this.sourceTags = languages.source_tags ?? {};
    this.targetTokens = languages.target_tokens ?? {};
    this.names = names;
  }

  // `text` and its target prefix (null: none) as the model takes them: a multilingual model's
  // text after the tag of `targetLanguage`; a many-to-many import's after the token of
  // `sourceLanguage`, its target starting with the token of `targetLanguage`; a bilingual
  // model's as it is, a target language asked being its own. A blank text stays blank.
  request(text, targetLanguage, sourceLanguage) {
    const given = (code) => (code === undefined || code === null || code === "" ? null : code);
    const [target, source] = [given(targetLanguage), given(sourceLanguage)];
    const tag = (t) => (text.trim() === "" ? text : `${t} ${text}`);
    if (Object.keys(this.sourceTags).length > 0) {
      const sourceTag = this.#token(this.sourceTags, source, "source");
      return { source: tag(sourceTag), prefix: this.#token(this.targetTokens, target, "target") };
    }
    if (Object.keys(this.tags).length > 0) {
      return { source: tag(this.#token(this.tags, target, "target")), prefix: null };
    }
    if (target !== null && target !== this.target) {
      throw new Error(`${this.names.target}: this model translates into ` +
        `${this.target ?? "one language"} only, not ${target}`);
    }
    return { source: text, prefix: null };
  }

  // The entry of `table` ({code: token}) for `code`, asked as the `side` language.
  #token(table, code, side) {
    const name = this.names[side];
    const direction = side === "source" ? "from" : "into";
    const known = Object.keys(table).sort();
    const listed = known.length <= 12 ? known.join(", ")
      : `${known.slice(0, 12).join(", ")} and ${known.length - 12} more (model.json lists them)`;
    if (code === null) throw new Error(`this model translates ${direction} ${listed}: give ${name}`);
    if (!(code in table)) {
      throw new Error(`${name}: unknown language '${code}'; this model translates ${direction} ${listed}`);
    }
    return table[code];
  }
}

// The inputs a JavaScript runtime always feeds, whose initializers it drops from the model
// (onnx-protobuf.mjs says why): every search option, and the target prefix of a model whose
// targets start with their language's token.
export function alwaysFed(metadata) {
  const takesPrefix = Object.keys(metadata.languages?.target_tokens ?? {}).length > 0;
  return [...Object.keys(metadata.defaults), ...(takesPrefix ? ["target_prefix"] : [])];
}

// Rows of ids as an int32 [rows, longest] tensor (at least one column), right-padded.
export function paddedIds(Tensor, rows, pad) {
  const width = Math.max(1, ...rows.map((row) => row.length));
  const data = new Int32Array(rows.length * width).fill(pad);
  rows.forEach((row, i) => data.set(row, i * width));
  return new Tensor("int32", data, [rows.length, width]);
}

// The scalar feeds of the search options asked (`asked`: {name: value}, as model.json's
// `defaults` names them); with `all`, every option, those not asked at their exported
// default; `spelled(name)`: how the runtime names an option, for its error message. A greedy
// export (export.onnx_search: greedy) takes no beam options: a beam of 1 is what it does and
// it has no length penalty to apply, as the Python runtime has it.
export function optionFeeds(Tensor, metadata, asked, { all = false, spelled = (name) => name } = {}) {
  const options = all ? { ...metadata.defaults, ...asked } : asked;
  const feeds = {};
  for (const [name, value] of Object.entries(options)) {
    const dtype = metadata.option_dtypes[name];
    if (dtype === undefined) {
      if ((name === "beam_size" && value === 1) || name === "length_penalty" || name === "n_best") continue;
      throw new Error(`this export has the ${metadata.search} search alone and takes no ` +
        `${spelled(name)} ${value}`);
    }
    const data = dtype === "float32" ? Float32Array.from([value]) : Int32Array.from([value]);
    feeds[name] = new Tensor(dtype, data, []);
  }
  return feeds;
}

// Hypothesis `n` of the search's `ids` output ([batch, n_best, width], flattened), the
// sentence being row `row`: its ids up to </s>, padding dropped.
export function hypothesisIds(ids, { pad, eos }, row, n) {
  const [, nBest, width] = ids.dims;
  const start = (row * nBest + n) * width;
  const all = Array.from(ids.data.slice(start, start + width));
  const end = all.indexOf(eos);
  return (end < 0 ? all : all.slice(0, end)).filter((id) => id !== pad);
}

// The translation of target `ids`, as every runtime writes it: without spaces at either end
// where model.json says `strip_translation_spaces` (pipeline/core/translation_text.py).
export function decodedText(processor, ids, metadata) {
  const text = processor.decodeIds(ids);
  return metadata.strip_translation_spaces ? text.replace(/^ +| +$/g, "") : text;
}
