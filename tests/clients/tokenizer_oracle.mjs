// The reference encodings for the tokenizer tests (tests/cli/tokenizer_oracle.sh):
// Hugging Face's own JavaScript tokenizers (@huggingface/tokenizers) over a
// tokenizer.json folder. Standard input: one JSON string per line. Standard
// output, one JSON object per line:
//   {"ids": encode(text).ids, "plain": encode(text, {add_special_tokens: false}).ids,
//    "text": decode(ids), "skip": decode(ids, {skip_special_tokens: true})}
// With --raw: standard input is read as bytes and decoded as UTF-8 (invalid
// sequences become U+FFFD, as TextDecoder does); one object for it.
// With --time N: encodes standard input's text N times and prints the best
// seconds (the benchmark's JS figure, bench/tokenizer.sh).
import { Tokenizer } from "@huggingface/tokenizers";
import fs from "node:fs";
import readline from "node:readline";

const [dir, mode, arg] = process.argv.slice(2);
const load = (f) => JSON.parse(fs.readFileSync(`${dir}/${f}`, "utf8"));
const tok = new Tokenizer(load("tokenizer.json"), load("tokenizer_config.json"));
// decode() refuses an empty list; its text is "".
const decode = (ids, options) => (ids.length ? tok.decode(ids, options) : "");
const row = (text) => {
  const ids = tok.encode(text).ids;
  return JSON.stringify({
    ids,
    plain: tok.encode(text, { add_special_tokens: false }).ids,
    text: decode(ids),
    skip: decode(ids, { skip_special_tokens: true }),
  });
};

if (mode === "--raw") {
  const text = new TextDecoder("utf-8").decode(fs.readFileSync(0));
  process.stdout.write(row(text) + "\n");
} else if (mode === "--time") {
  const text = fs.readFileSync(0, "utf8");
  let best = Infinity, n = 0;
  for (let r = 0; r < Number(arg || 3); r++) {
    const t0 = process.hrtime.bigint();
    n = tok.encode(text, { add_special_tokens: false }).ids.length;
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  process.stdout.write(JSON.stringify({ seconds: best, tokens: n, bytes: Buffer.byteLength(text) }) + "\n");
} else {
  const out = [];
  for await (const line of readline.createInterface({ input: process.stdin, crlfDelay: Infinity })) {
    out.push(row(JSON.parse(line)));
  }
  process.stdout.write(out.join("\n") + (out.length ? "\n" : ""));
}
