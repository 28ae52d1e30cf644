// The request of each case of a request_languages.json file as the JavaScript the page and
// Node.js share makes it (examples/shared/exported-model.mjs): prints one JSON object a case,
// {source, prefix} or {error: its message}, in the cases' order.
//
//   node tests/request_languages.mjs tests/fixtures/request_languages.json
import fs from "node:fs";
import { RequestLanguages } from "../examples/shared/exported-model.mjs";

const { models, cases } = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
for (const c of cases) {
  const languages = new RequestLanguages(models[c.model]);
  let result;
  try {
    result = languages.request(c.sentence, c.target_language, c.source_language);
  } catch (error) {
    result = { error: error.message };
  }
  console.log(JSON.stringify(result));
}
