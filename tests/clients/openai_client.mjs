// The official openai npm client against `tessera serve`: completions and
// chat completions, plain and streamed, models.list, and a wrong key.
// Run by tests/cli/serve_openai_client.sh:
//   node openai_client.mjs PORT KEY MODEL_ID
// Prints one "ok   ..." line per check and one "FAIL ..." line per failure;
// exits 1 if any check failed.
import OpenAI from "openai";

const [port, apiKey, modelId] = process.argv.slice(2);
if (!port || !apiKey || !modelId) {
  console.error("usage: node openai_client.mjs PORT KEY MODEL_ID");
  process.exit(2);
}
// TESSERA_SCHEME=https: the same checks over TLS (the CA in NODE_EXTRA_CA_CERTS).
const baseURL = `${process.env.TESSERA_SCHEME || "http"}://127.0.0.1:${port}/v1`;
// No retries: a failure shows as the first error, not as a slow test.
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 30_000 });

let failures = 0;
function check(name, cond, detail) {
  if (cond) {
    console.log(`ok   ${name}`);
  } else {
    failures++;
    console.log(`FAIL ${name}: ${detail}`);
  }
}
const show = (v) => JSON.stringify(v);

// Runs one named step; an exception is a failure of that step, not of the run.
async function step(name, fn) {
  try {
    await fn();
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: threw ${e?.constructor?.name}: ${e?.message}`);
  }
}

const prompt = "The licensee may ";
const greedy = { model: modelId, prompt, max_tokens: 8, temperature: 0 };
let plainText = null;

await step("completion", async () => {
  const r = await client.completions.create(greedy);
  const c = r.choices?.[0];
  check("completion: choices[0].text is a string", typeof c?.text === "string", show(r));
  check("completion: finish_reason is length", c?.finish_reason === "length", show(c?.finish_reason));
  check("completion: usage.completion_tokens is 8", r.usage?.completion_tokens === 8, show(r.usage));
  check("completion: object and model", r.object === "text_completion" && r.model === modelId, show(r));
  plainText = c?.text ?? null;
});

await step("streamed completion", async () => {
  const stream = await client.completions.create({ ...greedy, stream: true });
  let text = "";
  let chunks = 0;
  let finish = null;
  for await (const chunk of stream) {
    chunks++;
    const c = chunk.choices?.[0];
    if (typeof c?.text === "string") text += c.text;
    if (c?.finish_reason) finish = c.finish_reason;
  }
  check("streamed completion: at least one chunk", chunks > 0, `${chunks} chunks`);
  check("streamed completion: finish_reason is length", finish === "length", show(finish));
  check("streamed completion: text equals the greedy completion's", text === plainText,
        `streamed ${show(text)}, plain ${show(plainText)}`);
});

// The tiny test model's greedy text can be all one byte; a seeded sampled
// request gives varied bytes and must stream the same text too.
await step("seeded completion, plain and streamed", async () => {
  const sampled = { model: modelId, prompt, max_tokens: 12, temperature: 1, seed: 7 };
  const plain = (await client.completions.create(sampled)).choices?.[0]?.text;
  let text = "";
  for await (const chunk of await client.completions.create({ ...sampled, stream: true })) {
    text += chunk.choices?.[0]?.text ?? "";
  }
  check("seeded completion: streamed text equals plain", typeof plain === "string" && text === plain,
        `streamed ${show(text)}, plain ${show(plain)}`);
});

const messages = [{ role: "user", content: "What may the licensee do?" }];
let chatText = null;

await step("chat completion", async () => {
  const r = await client.chat.completions.create({ model: modelId, messages, max_tokens: 8, temperature: 0 });
  const m = r.choices?.[0]?.message;
  check("chat completion: message.role is assistant", m?.role === "assistant", show(r));
  check("chat completion: message.content is a string", typeof m?.content === "string", show(m));
  check("chat completion: object", r.object === "chat.completion", show(r.object));
  chatText = m?.content ?? null;
});

await step("streamed chat completion", async () => {
  const stream = await client.chat.completions.create({
    model: modelId, messages, max_tokens: 8, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = "";
  let role = null;
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    const c = chunk.choices?.[0];
    if (c?.delta?.role) role = c.delta.role;
    if (typeof c?.delta?.content === "string") text += c.delta.content;
    if (c?.finish_reason) finish = c.finish_reason;
    if (chunk.usage) usage = chunk.usage;
  }
  check("streamed chat: a delta with role assistant", role === "assistant", show(role));
  check("streamed chat: finish_reason set", finish === "length" || finish === "stop", show(finish));
  check("streamed chat: content equals the greedy chat completion's", text === chatText,
        `streamed ${show(text)}, plain ${show(chatText)}`);
  check("streamed chat: usage chunk (include_usage)", usage !== null && usage.completion_tokens >= 1, show(usage));
});

await step("models.list", async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  check("models.list: returns the served id", ids.includes(modelId), `ids ${show(ids)}, want ${show(modelId)}`);
});

await step("wrong key", async () => {
  const bad = new OpenAI({ baseURL, apiKey: apiKey + "-wrong", maxRetries: 0, timeout: 30_000 });
  try {
    await bad.completions.create(greedy);
    check("wrong key: AuthenticationError", false, "the request succeeded");
  } catch (e) {
    check("wrong key: AuthenticationError (401)", e instanceof OpenAI.AuthenticationError && e.status === 401,
          `${e?.constructor?.name} status ${e?.status}: ${e?.message}`);
    check("wrong key: error.code is invalid_api_key", e?.code === "invalid_api_key", show(e?.error));
  }
});

console.log(failures === 0 ? "openai client: all checks passed" : `openai client: ${failures} failed`);
process.exit(failures === 0 ? 0 : 1);
