// Translate sentences with a model exported by `python -m export`, in Node.js.
//
//   npm install --ignore-scripts      # the CPU runtime ships in the package
//   node translate.mjs EXPORT_DIR/onnx "Ein Hund läuft über eine Wiese." [--beam-size 5]
//     [--length-penalty A] [--max-length N] [--to fr]
//
// --to: the language a multilingual model translates into (model.json lists its languages
// and their tags).
// Prints one translation a line. Tokenisation uses the exported SentencePiece models (the
// same files the Python runtime and the SavedModel use), so all three give the same ids.
import fs from "node:fs";
import path from "node:path";
import * as ort from "onnxruntime-node";
import { SentencePieceProcessor } from "@sctg/sentencepiece-js";

function parseArgs(argv) {
  const args = { sentences: [], options: {} };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--beam-size") args.options.beam_size = Number(argv[++i]);
    else if (argv[i] === "--length-penalty") args.options.length_penalty = Number(argv[++i]);
    else if (argv[i] === "--max-length") args.options.max_length = Number(argv[++i]);
    else if (argv[i] === "--to") args.to = argv[++i];
    else if (args.directory === undefined) args.directory = argv[i];
    else args.sentences.push(argv[i]);
  }
  if (args.directory === undefined || args.sentences.length === 0) {
    console.error(
      "usage: node translate.mjs EXPORT_DIR/onnx SENTENCE... " +
        "[--beam-size K] [--length-penalty A] [--max-length N] [--to LANGUAGE]",
    );
    process.exit(2);
  }
  return args;
}

// Loads one file of the export; a missing or damaged file is named in the error, so that a
// user with several exports knows which one is broken.
async function loadFile(file, what, load) {
  try {
    return await load(file);
  } catch (error) {
    const reason = String(error?.message ?? error).split("\n")[0];
    throw new Error(`${file}: cannot load the ${what} (${reason})`);
  }
}

const REQUIRED_KEYS = ["model", "source_vocabulary", "target_vocabulary", "special_ids",
  "max_source_length", "option_dtypes"];

// The package ignores a failed load (its processor then encodes nothing): a probe tells.
async function loadProcessor(file) {
  const processor = new SentencePieceProcessor();
  await processor.load(file);
  if (processor.encodeIds("a").length === 0) throw new Error("not a SentencePiece model");
  return processor;
}

async function loadTranslator(directory) {
  const metadataFile = path.join(directory, "model.json");
  const metadata = await loadFile(metadataFile, "export's description", (file) =>
    JSON.parse(fs.readFileSync(file, "utf8")),
  );
  const missing = REQUIRED_KEYS.filter((key) => !(key in metadata));
  if (missing.length > 0) {
    throw new Error(`${metadataFile}: no "${missing[0]}": export the model again (python -m export)`);
  }
  // logSeverityLevel 3: the search settings are inputs with defaults by design, not a problem.
  const session = await loadFile(path.join(directory, metadata.model), "ONNX model", (file) =>
    ort.InferenceSession.create(file, { logSeverityLevel: 3 }),
  );
  const source = await loadFile(path.join(directory, metadata.source_vocabulary), "vocabulary",
    loadProcessor);
  const target = await loadFile(path.join(directory, metadata.target_vocabulary), "vocabulary",
    loadProcessor);
  return { metadata, session, source, target };
}

// One batch, right-padded; scalar options left out take the exported defaults.
async function translate({ metadata, session, source, target }, sentences, options) {
  const { pad, eos } = metadata.special_ids;
  const ids = sentences.map((s) => source.encodeIds(s).slice(0, metadata.max_source_length));
  const width = Math.max(1, ...ids.map((row) => row.length));
  const padded = new Int32Array(ids.length * width).fill(pad);
  ids.forEach((row, i) => padded.set(row, i * width));
  const feeds = { source_ids: new ort.Tensor("int32", padded, [ids.length, width]) };
  // Each option's dtype is in model.json (declared once, in export/signature.py).
  for (const [name, value] of Object.entries(options)) {
    const dtype = metadata.option_dtypes[name];
    if (dtype === undefined) {
      // A greedy export (export.onnx_search: greedy) takes no beam options: a beam of 1 is
      // what it does and it has no length penalty to apply, as the Python runtime has it.
      if ((name === "beam_size" && value === 1) || name === "length_penalty") continue;
      throw new Error(`this export has the ${metadata.search} search alone and takes no --${name.replace("_", "-")} ${value}`);
    }
    const data = dtype === "float32" ? Float32Array.from([value]) : Int32Array.from([value]);
    feeds[name] = new ort.Tensor(dtype, data, []);
  }
  const output = await session.run(feeds);
  const [, nBest, maxLength] = output.ids.dims;
  return ids.map((row, i) => {
    if (row.length === 0) return "";
    const best = Array.from(output.ids.data.slice(i * nBest * maxLength, (i * nBest + 1) * maxLength));
    const end = best.indexOf(eos);
    const tokens = (end < 0 ? best : best.slice(0, end)).filter((t) => t !== pad);
    return target.decodeIds(tokens);
  });
}

// The sentences as the model takes them: a multilingual model's, each after the tag of the
// language asked (a blank one stays blank); a bilingual model takes only its own language.
function requests({ languages = {} }, sentences, to) {
  const tags = languages.tags ?? {};
  const known = Object.keys(tags).sort();
  if (known.length === 0) {
    if (to !== undefined && to !== languages.target) {
      throw new Error(`--to: this model translates into ${languages.target ?? "one language"} only, not ${to}`);
    }
    return sentences;
  }
  if (to === undefined) throw new Error(`this model translates into ${known.join(", ")}: give --to`);
  if (!(to in tags)) {
    throw new Error(`--to: unknown language '${to}'; this model translates into ${known.join(", ")}`);
  }
  return sentences.map((s) => (s.trim() === "" ? s : `${tags[to]} ${s}`));
}

const args = parseArgs(process.argv.slice(2));
let lines;
try {
  const translator = await loadTranslator(args.directory);
  const sentences = requests(translator.metadata, args.sentences, args.to);
  lines = await translate(translator, sentences, args.options);
} catch (error) {
  console.error(`error: ${error.message}`);
  process.exit(2);
}
for (const line of lines) console.log(line);
