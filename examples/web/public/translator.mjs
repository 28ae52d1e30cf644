// An exported model in the browser: onnxruntime-web (WebAssembly) runs model.onnx, a
// WebAssembly SentencePiece tokenises with the exported vocabularies. Everything the page
// needs to know about the model comes from its model.json.
import * as ort from "onnxruntime-web";
import { SentencePieceProcessor } from "@sctg/sentencepiece-js";
import { fetchBytes, fetchFile } from "./node-builtins.mjs";
import { dropInitializers } from "./onnx-protobuf.mjs";

// What the page reads from model.json; an export without one of them is too old.
const REQUIRED_KEYS = [
  "model", "source_vocabulary", "target_vocabulary", "special_ids", "defaults",
  "option_dtypes", "max_source_length",
];

async function fetchText(url) {
  return new TextDecoder().decode(await fetchBytes(url));
}

// Loads one file of the export; an error names the file (its path on the server), so that a
// damaged export says which of its files is broken.
async function loadFile(url, what, load) {
  try {
    return await load(url);
  } catch (error) {
    const reason = String(error?.message ?? error).split("\n")[0];
    const name = new URL(url).pathname;
    throw new Error(reason.startsWith(name) ? reason : `${name}: cannot load the ${what} (${reason})`);
  }
}

// The package ignores a failed load (its processor then encodes nothing): a probe tells.
async function loadProcessor(url) {
  const processor = new SentencePieceProcessor();
  await fetchFile(url);
  await processor.load(url);
  if (processor.encodeIds("a").length === 0) throw new Error("not a SentencePiece model");
  return processor;
}

// SentencePiece writes NAME.vocab beside NAME.model, one "piece<TAB>score" line per id; the
// WebAssembly build has no id -> piece lookup, and the heatmap labels need the pieces.
async function loadPieces(modelUrl) {
  const text = await fetchText(modelUrl.replace(/\.model$/, ".vocab"));
  return text.split("\n").map((line) => line.split("\t")[0]);
}

// Drops SentencePiece's word-start mark so that labels read as text (as attention_plot.py).
export function pieceLabel(piece) {
  return piece.replaceAll("\u2581", "") || "\u2423";
}

export class Translator {
  // `base`: the URL of an export's onnx/ directory, ending in "/"; `int8`: load its int8 model
  // (model.json's int8_model) rather than the float32 one.
  static async load(base, { int8 = false } = {}) {
    const url = (name) => new URL(name, base).href;
    const metadata = await loadFile(url("model.json"), "export's description", async (file) =>
      JSON.parse(await fetchText(file)),
    );
    const missing = REQUIRED_KEYS.filter((key) => !(key in metadata));
    if (missing.length > 0) {
      throw new Error(`${new URL(url("model.json")).pathname}: no "${missing[0]}": export the ` +
        "model again (python -m export)");
    }
    if (metadata.external_data) {
      throw new Error("this export keeps its weights in files beside its models (they pass " +
        "512 MiB): too large for a page; export a smaller model for the browser");
    }
    if (int8 && !metadata.int8_model) {
      throw new Error("this export has no int8 model: export it with export.onnx_int8: true");
    }
    const modelFile = int8 ? metadata.int8_model : metadata.model;
    // A model whose targets start with their language's token is always given a prefix.
    const takesPrefix = Object.keys(metadata.languages?.target_tokens ?? {}).length > 0;
    const fedAlways = [...Object.keys(metadata.defaults), ...(takesPrefix ? ["target_prefix"] : [])];
    let modelBytes;
    // All settled, so that a missing file is reported in this order whatever loads first.
    const loaded = await Promise.allSettled([
      loadFile(url(modelFile), "ONNX model", async (file) => {
        const bytes = await fetchBytes(file);
        modelBytes = bytes.byteLength;
        // logSeverityLevel 3: target_prefix is an input with a default by design, not a problem.
        return ort.InferenceSession.create(dropInitializers(bytes, fedAlways), {
          executionProviders: ["wasm"],
          logSeverityLevel: 3,
        });
      }),
      loadFile(url(metadata.source_vocabulary), "vocabulary", loadProcessor),
      loadFile(url(metadata.target_vocabulary), "vocabulary", loadProcessor),
      loadFile(url(metadata.source_vocabulary), "vocabulary", loadPieces),
      loadFile(url(metadata.target_vocabulary), "vocabulary", loadPieces),
    ]);
    const failed = loaded.find(({ status }) => status === "rejected");
    if (failed) throw failed.reason;
    const translator = new Translator(metadata, ...loaded.map(({ value }) => value));
    return Object.assign(translator, { modelFile, modelBytes });
  }

  constructor(metadata, session, source, target, sourcePieces, targetPieces) {
    Object.assign(this, { metadata, session, source, target, sourcePieces, targetPieces });
  }

  // What the page says of the model it runs: its name, kind and parameters (model.json's
  // description, from the export) and the file loaded, with its size.
  get description() {
    const { name, type, parameters } = this.metadata.description ?? {};
    const megabytes = (this.modelBytes / 1e6).toFixed(1);
    const what = name ? `${name} (${[type, parameters && `${(parameters / 1e6).toFixed(1)}M ` +
      "parameters"].filter(Boolean).join(", ")}) · ` : "";
    return `${what}${this.modelFile}, ${megabytes} MB`;
  }

  // Whether the model has the greedy search alone (export.onnx_search: greedy), no beam.
  get greedy() {
    return this.metadata.search === "greedy";
  }

  // The languages a multilingual model translates into ([] for a bilingual one), and those
  // it translates from where it takes the source's too (an imported M2M100 or NLLB).
  get languages() {
    return this.metadata.languages?.targets ?? [];
  }

  get sourceLanguages() {
    return this.metadata.languages?.sources ?? [];
  }

  // `text` and its target prefix (null: none) as the model takes them, as every other runtime
  // makes them: after the tag of `targetLanguage` for a multilingual model; after the token
  // of `sourceLanguage`, the target starting with the token of `targetLanguage`, for a
  // many-to-many import (a blank text stays blank).
  request(text, targetLanguage, sourceLanguage) {
    const { tags = {}, source_tags: sourceTags = {}, target_tokens: targetTokens = {} } =
      this.metadata.languages ?? {};
    const token = (table, code, side) => {
      if (!(code in table)) {
        throw new Error(`Unknown ${side} language '${code}': this model translates ` +
          `${side === "source" ? "from" : "into"} ${Object.keys(table).sort().join(", ")}.`);
      }
      return table[code];
    };
    const many = Object.keys(sourceTags).length > 0;
    const tag = many ? token(sourceTags, sourceLanguage, "source")
      : Object.keys(tags).length > 0 ? token(tags, targetLanguage, "target") : null;
    const prefix = many ? token(targetTokens, targetLanguage, "target") : null;
    return { source: tag === null || text.trim() === "" ? text : `${tag} ${text}`, prefix };
  }

  // How many threads the WebAssembly backend runs on: more than one only where the page is
  // cross-origin isolated (serve.mjs sends the headers) and the machine has cores to spare.
  get threads() {
    return ort.env.wasm.numThreads;
  }

  // The n-best hypotheses of `text` (into `targetLanguage`, from `sourceLanguage`, for a
  // model that takes them), best first, each with its text, score, target pieces (</s>
  // included where it ended) and attention rows over the source pieces. Sources are cut at
  // max_source_length pieces, and an empty one gives no hypotheses (an empty translation),
  // as in the Python runtime.
  async translate(text, { beamSize, lengthPenalty, targetLanguage, sourceLanguage }) {
    const { pad, eos } = this.metadata.special_ids;
    const { source, prefix } = this.request(text, targetLanguage, sourceLanguage);
    const allIds = this.source.encodeIds(source);
    const sourceIds = allIds.slice(0, this.metadata.max_source_length);
    const result = {
      sourcePieces: sourceIds.map((id) => this.sourcePieces[id]),
      cutFrom: allIds.length > sourceIds.length ? allIds.length : null,
      hypotheses: [],
    };
    if (sourceIds.length === 0) return result;
    // Every search option of the model is an input the page must give (see
    // onnx-protobuf.mjs); a greedy export (export.onnx_search: greedy) has no beam options.
    if (this.greedy && beamSize !== 1) {
      throw new Error("This model has the greedy search alone: its beam size is 1.");
    }
    const asked = { beam_size: beamSize, n_best: beamSize, length_penalty: lengthPenalty };
    const options = { ...this.metadata.defaults };
    for (const name of Object.keys(options)) {
      if (name in asked) options[name] = asked[name];
    }
    const feeds = {
      source_ids: new ort.Tensor("int32", Int32Array.from(sourceIds), [1, sourceIds.length]),
    };
    if (prefix !== null) {
      const prefixIds = this.target.encodeIds(prefix);
      feeds.target_prefix = new ort.Tensor("int32", Int32Array.from(prefixIds), [1, prefixIds.length]);
    }
    for (const [name, value] of Object.entries(options)) {
      const dtype = this.metadata.option_dtypes[name];
      const data = dtype === "float32" ? Float32Array.from([value]) : Int32Array.from([value]);
      feeds[name] = new ort.Tensor(dtype, data, []);
    }
    const output = await this.session.run(feeds);
    const [, nBest, width] = output.ids.dims;
    const columns = sourceIds.length;
    for (let n = 0; n < nBest; n++) {
      const ids = Array.from(output.ids.data.slice(n * width, (n + 1) * width));
      const length = output.lengths.data[n];
      const end = ids.indexOf(eos);
      const words = (end < 0 ? ids : ids.slice(0, end)).filter((id) => id !== pad);
      const attention = [];
      for (let row = 0; row < length; row++) {
        const start = (n * width + row) * columns;
        attention.push(Array.from(output.attention.data.slice(start, start + columns)));
      }
      result.hypotheses.push({
        text: this.target.decodeIds(words),
        score: output.scores.data[n],
        targetPieces: ids.slice(0, length).map((id) => this.targetPieces[id]),
        attention,
      });
    }
    return result;
  }
}
