// The page: loads the model served under model/, translates what is typed and shows the
// translation, the n-best list and the attention of the chosen hypothesis.
import { Translator, pieceLabel } from "./translator.mjs";

const MODEL_DIRECTORY = new URL("model/", document.baseURI);
// ?weights=int8 runs the export's int8 model (smaller, faster on most CPUs).
const INT8 = new URLSearchParams(location.search).get("weights") === "int8";
const element = (id) => document.getElementById(id);
const app = element("app");
let translator;
let modelDescription; // the status line while the page is ready
let shown = { sourcePieces: [], hypotheses: [] }; // the last translation

function languageName(code) {
  if (!code) return null;
  try {
    return new Intl.DisplayNames(["en"], { type: "language" }).of(code.replace("_", "-"));
  } catch {
    return code; // not a code Intl knows: show it as it is
  }
}

// `state`: loading, ready, translating or error; the tests wait on it (app's data-state).
function setStatus(text, state) {
  element("status").textContent = text;
  element("status").classList.toggle("error", state === "error");
  app.dataset.state = state;
}

function showLanguages({ source, target }) {
  const [sourceName, targetName] = [languageName(source), languageName(target)];
  element("languages").textContent = `${sourceName ?? "source"} → ${targetName ?? "target"}`;
  element("source-label").textContent = sourceName ?? "Source";
  element("target-label").textContent = targetName ?? "Translation";
}

// The menu of `side` ("source" or "target") offering `codes`, shown; its card's title names
// the language chosen.
function showMenu(side, codes, fallback) {
  const menu = element(`${side}-language`);
  menu.replaceChildren(...codes.map((code) => {
    const option = node("option", languageName(code) ?? code);
    option.value = code;
    return option;
  }));
  element(`${side}-language-field`).hidden = false;
  const label = () => {
    element(`${side}-label`).textContent = languageName(menu.value) ?? fallback;
  };
  menu.addEventListener("change", label);
  label();
}

// A multilingual model: a menu of the languages it translates into (and, for a model that
// takes it, of the source's), the header naming them, or counting them where they are many.
function showLanguageMenus(targets, sources) {
  const named = (codes) =>
    codes.length <= 8 ? codes.map(languageName).join(", ") : `${codes.length} languages`;
  showMenu("target", targets, "Translation");
  if (sources.length > 0) showMenu("source", sources, "Source");
  element("languages").textContent = sources.length > 0
    ? `between ${named([...new Set([...sources, ...targets])])}` : `into ${named(targets)}`;
}

function node(tag, text, className) {
  const created = document.createElement(tag);
  created.textContent = text;
  if (className) created.className = className;
  return created;
}

function showNBest() {
  const rows = shown.hypotheses.map((hypothesis, rank) => {
    const row = document.createElement("tr");
    row.dataset.score = String(hypothesis.score);
    row.append(
      node("td", String(rank + 1), "rank"),
      node("td", hypothesis.text, "hypothesis"),
      node("td", hypothesis.score.toFixed(3), "number"),
    );
    row.addEventListener("click", () => showAttention(rank));
    return row;
  });
  element("nbest").tBodies[0].replaceChildren(...rows);
}

// Rows: the hypothesis' pieces; columns: the source pieces; darker where the decoder looked.
function showAttention(rank) {
  for (const [index, row] of [...element("nbest").tBodies[0].rows].entries()) {
    row.classList.toggle("selected", index === rank);
  }
  const hypothesis = shown.hypotheses[rank];
  element("attention-of").textContent = hypothesis ? `of hypothesis ${rank + 1}` : "";
  if (!hypothesis) {
    element("heatmap").replaceChildren();
    return;
  }
  const sourceLabels = shown.sourcePieces.map(pieceLabel);
  const nodes = [node("div", "", "corner")];
  for (const label of sourceLabels) nodes.push(node("div", label, "column-label"));
  hypothesis.attention.forEach((weights, row) => {
    const targetLabel = pieceLabel(hypothesis.targetPieces[row]);
    nodes.push(node("div", targetLabel, "row-label"));
    weights.forEach((weight, column) => {
      const square = node("div", "", "cell");
      square.style.setProperty("--weight", `${(100 * weight).toFixed(1)}%`);
      square.title = `${sourceLabels[column]} → ${targetLabel}: ${weight.toFixed(3)}`;
      nodes.push(square);
    });
  });
  element("heatmap").style.setProperty("--columns", sourceLabels.length);
  element("heatmap").replaceChildren(...nodes);
}

function readOptions() {
  const beamSize = Number(element("beam-size").value);
  const lengthPenalty = Number(element("length-penalty").value);
  if (!Number.isInteger(beamSize) || beamSize < 1) {
    throw new Error("The beam size is a whole number from 1.");
  }
  if (!Number.isFinite(lengthPenalty) || lengthPenalty < 0) {
    throw new Error("The length penalty is a number from 0.");
  }
  return {
    beamSize,
    lengthPenalty,
    targetLanguage: element("target-language").value,
    sourceLanguage: element("source-language").value,
  };
}

function describe({ sourcePieces, hypotheses, cutFrom }, milliseconds) {
  const best = hypotheses[0];
  const details = best
    ? [
        `score ${best.score.toFixed(3)}`,
        `${sourcePieces.length} → ${best.targetPieces.length} pieces`,
        `${Math.round(milliseconds)} ms`,
      ]
    : ["Nothing to translate: the input has no pieces."];
  if (cutFrom !== null) {
    details.push(`input cut from ${cutFrom} to ${sourcePieces.length} pieces (the model's limit)`);
  }
  return details.join(" · ");
}

async function translate(text) {
  setStatus("Translating…", "translating");
  element("translate").disabled = true;
  delete element("result").dataset.source; // set again, to `text`, once it is shown
  try {
    const start = performance.now();
    shown = await translator.translate(text, readOptions());
    const milliseconds = performance.now() - start;
    element("translation").textContent = shown.hypotheses[0]?.text ?? "";
    element("details").textContent = describe(shown, milliseconds);
    element("result").dataset.milliseconds = milliseconds; // for drivers that time the page
    showNBest();
    showAttention(0);
    element("result").dataset.source = text;
    setStatus(modelDescription, "ready");
  } catch (error) {
    setStatus(error.message, "error");
  } finally {
    element("translate").disabled = false;
  }
}

async function start() {
  const startTime = performance.now();
  try {
    translator = await Translator.load(MODEL_DIRECTORY, { int8: INT8 });
  } catch (error) {
    setStatus(`Cannot load the model from ${MODEL_DIRECTORY.pathname}: ${error.message}`, "error");
    return;
  }
  const { metadata, threads } = translator;
  const seconds = ((performance.now() - startTime) / 1000).toFixed(1);
  modelDescription = `${translator.description} (opset ${metadata.opset}), loaded in ` +
    `${seconds} s · WebAssembly, ${threads} thread${threads === 1 ? "" : "s"}`;
  if (translator.languages.length > 0) {
    showLanguageMenus(translator.languages, translator.sourceLanguages);
  }
  else showLanguages(metadata.languages ?? {});
  // A greedy export has no beam options: the fields show what its search is, fixed.
  element("beam-size").value = metadata.defaults.beam_size ?? 1;
  element("length-penalty").value = metadata.defaults.length_penalty ?? 0;
  element("beam-size").disabled = element("length-penalty").disabled = translator.greedy;
  element("source").disabled = false;
  element("translate").disabled = false;
  setStatus(modelDescription, "ready");
  element("source").focus();
}

element("translate-form").addEventListener("submit", (event) => {
  event.preventDefault();
  // One search at a time: a session runs one request at once.
  if (app.dataset.state !== "translating") translate(element("source").value);
});
// Enter translates, as in a chat box; Shift+Enter starts a new line.
element("source").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    element("translate-form").requestSubmit();
  }
});

start();
