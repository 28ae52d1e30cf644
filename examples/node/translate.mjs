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
import { dropInitializers } from "../shared/onnx-protobuf.mjs";
import {
  alwaysFed, checkedMetadata, decodedText, hypothesisIds, loadFile, loadProcessor, optionFeeds, paddedIds,
  RequestLanguages,
} from "../shared/exported-model.mjs";

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

const LANGUAGE_FLAGS = { target: "--to", source: "--from" };
const spelled = (option) => `--${option.replaceAll("_", "-")}`;

async function loadTranslator(directory) {
  const metadataFile = path.join(directory, "model.json");
  const metadata = checkedMetadata(
    await loadFile(metadataFile, "export's description", (file) =>
      JSON.parse(fs.readFileSync(file, "utf8")),
    ),
    metadataFile,
  );
  const session = await loadFile(path.join(directory, metadata.model), "ONNX model", (file) =>
    loadSession(file, alwaysFed(metadata)),
  );
  const processor = (file) => loadProcessor(SentencePieceProcessor, file);
  const source = await loadFile(path.join(directory, metadata.source_vocabulary), "vocabulary",
    processor);
  const target = await loadFile(path.join(directory, metadata.target_vocabulary), "vocabulary",
    processor);
  return { metadata, session, source, target };
}

// The session of the ONNX model `file` without the initializers of the inputs `fed` (see
// onnx-protobuf.mjs), loaded from memory; a model whose tensors are in files beside it finds
// them in its own directory.
function loadSession(file, fed) {
  return ort.InferenceSession.create(dropInitializers(fs.readFileSync(file), fed), {
    // What ONNX Runtime says of the loops' graphs is not the user's concern.
    logSeverityLevel: 3,
    extra: { session: { model_external_initializers_file_folder_path: path.dirname(file) } },
  });
}

// The sentences, each asking for the languages given (`to`, `from`), in one right-padded
// batch; scalar options left out take the exported defaults.
async function translate({ metadata, session, source, target }, sentences, { to, from }, options) {
  const languages = new RequestLanguages(metadata.languages, LANGUAGE_FLAGS);
  const requests = sentences.map((sentence) => languages.request(sentence, to, from));
  const { pad } = metadata.special_ids;
  const ids = requests.map((r) => source.encodeIds(r.source).slice(0, metadata.max_source_length));
  const feeds = { source_ids: paddedIds(ort.Tensor, ids, pad) };
  if (requests[0].prefix !== null) {
    feeds.target_prefix = paddedIds(ort.Tensor, requests.map((r) => target.encodeIds(r.prefix)), pad);
  }
  Object.assign(feeds, optionFeeds(ort.Tensor, metadata, options, { all: true, spelled }));
  const output = await session.run(feeds);
  return ids.map((row, i) =>
    row.length === 0 ? "" : decodedText(target, hypothesisIds(output.ids, metadata.special_ids, i, 0), metadata),
  );
}

const args = parseArgs(process.argv.slice(2));
let lines;
try {
  const translator = await loadTranslator(args.directory);
  lines = await translate(translator, args.sentences, args, args.options);
} catch (error) {
  console.error(`error: ${error.message}`);
  process.exit(2);
}
for (const line of lines) console.log(line);
