// An exported model in the browser: onnxruntime-web (WebAssembly) runs model.onnx, a
// WebAssembly SentencePiece tokenises with the exported vocabularies. Everything the page
// needs to know about the model comes from its model.json.
import * as ort from "onnxruntime-web";
import { SentencePieceProcessor } from "@sctg/sentencepiece-js";
import { fetchBytes, fetchFile } from "./node-builtins.mjs";
import { dropInitializers } from "./shared/onnx-protobuf.mjs";
import {
  alwaysFed, checkedMetadata, decodedText, hypothesisIds, loadFile, loadProcessor, optionFeeds,
  RequestLanguages,
} from "./shared/exported-model.mjs";

const LANGUAGE_NAMES = { target: "the target language", source: "the source language" };

async function fetchText(url) {
  return new TextDecoder().decode(await fetchBytes(url));
}

// `load(url)`, an error naming the file by its path on the server.
function loadUrl(url, what, load) {
  return loadFile(url, what, load, new URL(url).pathname);
}

async function loadUrlProcessor(url) {
  await fetchFile(url);
  return loadProcessor(SentencePieceProcessor, url);
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
    const metadata = checkedMetadata(
      await loadUrl(url("model.json"), "export's description", async (file) =>
        JSON.parse(await fetchText(file)),
      ),
      new URL(url("model.json")).pathname,
    );
    if (metadata.external_data) {
      throw new Error("this export keeps its weights in files beside its models (they pass " +
        "512 MiB): too large for a page; export a smaller model for the browser");
    }
    if (int8 && !metadata.int8_model) {
      throw new Error("this export has no int8 model: export it with export.onnx_int8: true");
    }
    const modelFile = int8 ? metadata.int8_model : metadata.model;
    const fedAlways = alwaysFed(metadata);
    let modelBytes;
    // All settled, so that a missing file is reported in this order whatever loads first.
    const loaded = await Promise.allSettled([
      loadUrl(url(modelFile), "ONNX model", async (file) => {
        const bytes = await fetchBytes(file);
        modelBytes = bytes.byteLength;
        // logSeverityLevel 3: target_prefix is an input with a default by design, not a problem.
        return ort.InferenceSession.create(dropInitializers(bytes, fedAlways), {
          executionProviders: ["wasm"],
          logSeverityLevel: 3,
        });
      }),
      loadUrl(url(metadata.source_vocabulary), "vocabulary", loadUrlProcessor),
      loadUrl(url(metadata.target_vocabulary), "vocabulary", loadUrlProcessor),
      loadUrl(url(metadata.source_vocabulary), "vocabulary", loadPieces),
      loadUrl(url(metadata.target_vocabulary), "vocabulary", loadPieces),
    ]);
    const failed = loaded.find(({ status }) => status === "rejected");
    if (failed) throw failed.reason;
    const translator = new Translator(metadata, ...loaded.map(({ value }) => value));
    return Object.assign(translator, { modelFile, modelBytes });
  }

  constructor(metadata, session, source, target, sourcePieces, targetPieces) {
    Object.assign(this, { metadata, session, source, target, sourcePieces, targetPieces });
    this.requestLanguages = new RequestLanguages(metadata.languages, LANGUAGE_NAMES);
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
    const { source, prefix } = this.requestLanguages.request(text, targetLanguage, sourceLanguage);
    const allIds = this.source.encodeIds(source);
    const sourceIds = allIds.slice(0, this.metadata.max_source_length);
    const result = {
      sourcePieces: sourceIds.map((id) => this.sourcePieces[id]),
      cutFrom: allIds.length > sourceIds.length ? allIds.length : null,
      hypotheses: [],
    };
    if (sourceIds.length === 0) return result;
    // Every search option of the model is an input the page must give (`alwaysFed`); a
    // greedy export (export.onnx_search: greedy) has no beam options.
    const asked = { beam_size: beamSize, n_best: beamSize, length_penalty: lengthPenalty };
    const feeds = {
      source_ids: new ort.Tensor("int32", Int32Array.from(sourceIds), [1, sourceIds.length]),
      ...optionFeeds(ort.Tensor, this.metadata, asked, { all: true, spelled: (name) =>
        name.replaceAll("_", " ") }),
    };
    if (prefix !== null) {
      const prefixIds = this.target.encodeIds(prefix);
      feeds.target_prefix = new ort.Tensor("int32", Int32Array.from(prefixIds), [1, prefixIds.length]);
    }
    const output = await this.session.run(feeds);
    const [, nBest, width] = output.ids.dims;
    const columns = sourceIds.length;
    for (let n = 0; n < nBest; n++) {
      const words = hypothesisIds(output.ids, this.metadata.special_ids, 0, n);
      const length = output.lengths.data[n];
      const attention = [];
      for (let row = 0; row < length; row++) {
        const start = (n * width + row) * columns;
        attention.push(Array.from(output.attention.data.slice(start, start + columns)));
      }
      const ids = Array.from(output.ids.data.slice(n * width, n * width + length));
      result.hypotheses.push({
        text: decodedText(this.target, words, this.metadata),
        score: output.scores.data[n],
        targetPieces: ids.map((id) => this.targetPieces[id]),
        attention,
      });
    }
    return result;
  }
}
