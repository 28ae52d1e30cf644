// Translate sentences with a model exported by `python -m export`, in Node.js.
//
//   npm install --ignore-scripts      # the CPU runtime ships in the package
//   node translate.mjs EXPORT_DIR/onnx "Ein Hund läuft über eine Wiese." [--beam-size 5]
//     [--length-penalty A] [--max-length N] [--to fr] [--from de]
//
// --to: the language a multilingual model translates into; --from: the language of the
// sentences, for a model that takes it (an imported M2M100 or NLLB: their codes, such as
// deu_Latn). model.json lists a model's languages and their tokens.
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
    else if (argv[i] === "--from") args.from = argv[++i];
    else if (args.directory === undefined) args.directory = argv[i];
    else args.sentences.push(argv[i]);
  }
  if (args.directory === undefined || args.sentences.length === 0) {
    console.error(
      "usage: node translate.mjs EXPORT_DIR/onnx SENTENCE... " +
        "[--beam-size K] [--length-penalty A] [--max-length N] [--to LANGUAGE] [--from LANGUAGE]",
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

// Rows of ids as an int32 [rows, longest] tensor (at least one column), right-padded.
function padded(rows, pad) {
  const width = Math.max(1, ...rows.map((row) => row.length));
  const data = new Int32Array(rows.length * width).fill(pad);
  rows.forEach((row, i) => data.set(row, i * width));
  return new ort.Tensor("int32", data, [rows.length, width]);
}

// One batch, right-padded; scalar options left out take the exported defaults.
async function translate({ metadata, session, source, target }, { sentences, prefixes }, options) {
  const { pad, eos } = metadata.special_ids;
  const ids = sentences.map((s) => source.encodeIds(s).slice(0, metadata.max_source_length));
  const feeds = { source_ids: padded(ids, pad) };
  if (prefixes !== null) {
    feeds.target_prefix = padded(prefixes.map((prefix) => target.encodeIds(prefix)), pad);
  }
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

// The entry of `table` ({code: token}) for the language asked with `flag`.
function languageToken(table, asked, flag, side) {
  const known = Object.keys(table).sort();
  const listed = known.length <= 12 ? known.join(", ")
    : `${known.slice(0, 12).join(", ")} and ${known.length - 12} more (model.json lists them)`;
  if (asked === undefined) throw new Error(`this model translates ${side} ${listed}: give ${flag}`);
  if (!(asked in table)) {
    throw new Error(`${flag}: unknown language '${asked}'; this model translates ${side} ${listed}`);
  }
  return table[asked];
}

// The sentences and target prefixes (null: none) as the model takes them, as every runtime
// makes them: a multilingual model's sentences each after the tag of the language asked; an
// imported many-to-many model's after its source language's token, its targets starting with
// the target language's token (a blank sentence stays blank); a bilingual model takes only
// its own language.
function requests({ languages = {} }, sentences, to, from) {
  const { tags = {}, source_tags: sourceTags = {}, target_tokens: targetTokens = {} } = languages;
  const tagged = (tag) => sentences.map((s) => (s.trim() === "" ? s : `${tag} ${s}`));
  if (Object.keys(sourceTags).length > 0) {
    const tag = languageToken(sourceTags, from, "--from", "from");
    const first = languageToken(targetTokens, to, "--to", "into");
    return { sentences: tagged(tag), prefixes: sentences.map(() => first) };
  }
  if (Object.keys(tags).length > 0) {
    return { sentences: tagged(languageToken(tags, to, "--to", "into")), prefixes: null };
  }
  if (to !== undefined && to !== languages.target) {
    throw new Error(`--to: this model translates into ${languages.target ?? "one language"} only, not ${to}`);
  }
  return { sentences, prefixes: null };
}

const args = parseArgs(process.argv.slice(2));
let lines;
try {
  const translator = await loadTranslator(args.directory);
  const asked = requests(translator.metadata, args.sentences, args.to, args.from);
  lines = await translate(translator, asked, args.options);
} catch (error) {
  console.error(`error: ${error.message}`);
  process.exit(2);
}
for (const line of lines) console.log(line);
