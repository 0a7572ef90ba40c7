// The official openai npm client against `tessera serve` of a Hugging Face
// Llama folder (tests/cli/serve_llama.sh): a chat request is rendered by the
// folder's chat template, its prompt ids are the oracle's; streamed text is
// the non-streamed text; a request asking for tools gets a 400 naming them.
//   node openai_chat_template.mjs PORT MODEL_ID ORACLE_IDS_JSON MESSAGES_JSON
// Prints "ok   ..." / "FAIL ..." lines; exits 1 if any check failed.
import OpenAI from "openai";
import fs from "node:fs";

const [port, modelId, oracleFile, messagesFile] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "none", maxRetries: 0, timeout: 60_000 });
const oracle = JSON.parse(fs.readFileSync(oracleFile, "utf8"));
const messages = JSON.parse(fs.readFileSync(messagesFile, "utf8"));
let failures = 0;
const check = (name, cond, detail) => {
  if (cond) console.log(`ok   ${name}`);
  else {
    failures++;
    console.log(`FAIL ${name}: ${detail}`);
  }
};
const show = (v) => JSON.stringify(v);

try {
  const r = await client.chat.completions.create({
    model: modelId, messages, max_tokens: 12, temperature: 0, seed: 1, return_token_ids: true,
  });
  const c = r.choices[0];
  check("prompt ids are the oracle's apply_chat_template + encode", show(c.prompt_token_ids) === show(oracle),
        `server ${show(c.prompt_token_ids)}\n     oracle ${show(oracle)}`);
  check("usage counts the template's tokens", r.usage.prompt_tokens === oracle.length,
        `${r.usage.prompt_tokens} vs ${oracle.length}`);
  const text = c.message.content;
  let streamed = "";
  const stream = await client.chat.completions.create({
    model: modelId, messages, max_tokens: 12, temperature: 0, seed: 1, stream: true,
  });
  for await (const chunk of stream) streamed += chunk.choices[0]?.delta?.content ?? "";
  check("streamed text concatenates to the non-streamed text", streamed === text, `${show(streamed)} vs ${show(text)}`);
} catch (e) {
  check("chat completion", false, e.stack || e);
}

for (const [field, value] of [["tools", [{ type: "function", function: { name: "f", parameters: {} } }]],
                              ["response_format", { type: "json_object" }]]) {
  try {
    await client.chat.completions.create({ model: modelId, messages, max_tokens: 2, [field]: value });
    check(`${field} refused`, false, "accepted with 200");
  } catch (e) {
    check(`${field} refused with 400 naming it`, e.status === 400 && e.param === field && /not served/.test(e.message),
          `${e.status} ${e.param} ${e.message}`);
  }
}
process.exit(failures ? 1 : 0);
