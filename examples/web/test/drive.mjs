// Drives the page in a headless browser, as a person would: types each sentence, presses
// Enter and reads what the page shows. Prints one JSON object per sentence, as a JSON array.
//
//   node test/drive.mjs URL --browser /usr/bin/chromium [--beam-size K] [--to LANGUAGE]
//     [--from LANGUAGE] [--screenshot PNG]
//     SENTENCE... [--from LANGUAGE --to LANGUAGE SENTENCE...]...
//
// Options take effect in order: a choice of language applies to the sentences after it, so
// one page (the model loaded once) translates in several directions. puppeteer-core downloads
// no browser: --browser names the one to run. The screenshot is taken after the last sentence.
import puppeteer from "puppeteer-core";

const SETTINGS = {
  "--beam-size": "#beam-size",
  "--to": "#target-language",
  "--from": "#source-language",
};

// The URL, the browser, the screenshot's path, and the steps in order: each a setting
// ({ selector, value }) or a sentence ({ sentence }).
function parseArgs(argv) {
  const args = { steps: [] };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--browser") args.browser = argv[++i];
    else if (argv[i] === "--screenshot") args.screenshot = argv[++i];
    else if (argv[i] in SETTINGS) args.steps.push({ selector: SETTINGS[argv[i]], value: argv[++i] });
    else if (args.url === undefined) args.url = argv[i];
    else args.steps.push({ sentence: argv[i] });
  }
  if (args.url === undefined || args.browser === undefined) {
    console.error("usage: node test/drive.mjs URL --browser PATH [--beam-size K] " +
      "[--from LANGUAGE] [--to LANGUAGE] [--screenshot PNG] SENTENCE...");
    process.exit(2);
  }
  return args;
}

// Waits until the page is ready (or has failed: then its status line is the error).
async function waitUntilReady(page, translated) {
  await page.waitForFunction(
    (source) => {
      const state = document.getElementById("app").dataset.state;
      const shown = document.getElementById("result").dataset.source;
      return state === "error" || (state === "ready" && (source === null || shown === source));
    },
    { timeout: 60_000 },
    translated,
  );
  const status = await page.$eval("#app", (app) => app.dataset.state);
  if (status === "error") throw new Error(await page.$eval("#status", (line) => line.textContent));
}

async function setField(page, selector, text) {
  await page.$eval(selector, (field) => {
    field.value = "";
  });
  await page.type(selector, text);
}

// What the page shows for the sentence it translated last.
function readResult() {
  const text = (id) => document.getElementById(id).textContent;
  const heatmap = document.getElementById("heatmap");
  return {
    translation: text("translation"),
    details: text("details"),
    nBest: [...document.querySelectorAll("#nbest tbody tr")].map((row) => ({
      text: row.cells[1].textContent,
      score: Number(row.dataset.score),
    })),
    columnLabels: [...heatmap.querySelectorAll(".column-label")].map((n) => n.textContent),
    rowLabels: [...heatmap.querySelectorAll(".row-label")].map((n) => n.textContent),
    cells: heatmap.querySelectorAll(".cell").length,
    languages: text("languages"),
    status: text("status"),
    milliseconds: Number(document.getElementById("result").dataset.milliseconds),
    targetLabel: text("target-label"),
  };
}

const args = parseArgs(process.argv.slice(2));
const browser = await puppeteer.launch({
  executablePath: args.browser,
  // --no-sandbox: Chromium's sandbox refuses to start as root, as in containers.
  args: ["--no-sandbox", "--headless=new"],
  defaultViewport: { width: 1200, height: 800 },
});
try {
  const page = await browser.newPage();
  page.on("pageerror", (error) => console.error(`page error: ${error.message}`));
  await page.goto(args.url);
  await waitUntilReady(page, null);
  const results = [];
  for (const step of args.steps) {
    if (step.selector === "#beam-size") await setField(page, step.selector, step.value);
    else if (step.selector !== undefined) await page.select(step.selector, step.value);
    else {
      await setField(page, "#source", step.sentence);
      await page.focus("#source");
      await page.keyboard.press("Enter");
      await waitUntilReady(page, step.sentence);
      results.push(await page.evaluate(readResult));
    }
  }
  if (args.screenshot) await page.screenshot({ path: args.screenshot });
  console.log(JSON.stringify(results));
} finally {
  await browser.close();
}
