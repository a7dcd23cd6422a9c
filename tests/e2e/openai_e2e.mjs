// End-to-end checks of `xdeepserve serve` through the official OpenAI npm client.
// Usage: node openai_e2e.mjs BASE_URL API_KEY MODEL_NAME
// Prints one JSON object with what it observed (the Python driver compares it with
// `xdeepserve generate`) and exits non-zero on the first failed check.
import { createRequire } from "node:module";

// The client pinned in tools/npm (installed by tools/install_deps.sh; nothing is downloaded).
const require = createRequire(new URL("../../tools/npm/package.json", import.meta.url));
const OpenAI = require("openai");

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
const observed = {};

function check(cond, what) {
  if (!cond) {
    console.error(`FAILED: ${what}`);
    process.exit(1);
  }
}

const prompt = "In the beginning God created";

// Completions, not streamed, greedy: the text the Python driver compares with `generate`.
{
  const r = await client.completions.create({
    model, prompt, max_tokens: 24, temperature: 0, ignore_eos: true,
  });
  check(r.object === "text_completion", "completions object");
  check(r.choices.length === 1 && typeof r.choices[0].text === "string", "completions choice");
  check(r.choices[0].finish_reason === "length", `finish_reason length, got ${r.choices[0].finish_reason}`);
  check(r.usage.completion_tokens === 24, `completion_tokens 24, got ${r.usage.completion_tokens}`);
  check(r.usage.total_tokens === r.usage.prompt_tokens + 24, "usage total");
  observed.greedy_text = r.choices[0].text;
  observed.prompt_tokens = r.usage.prompt_tokens;
}

// The same streamed, with the usage chunk: the concatenated deltas equal the whole text.
{
  const stream = await client.completions.create({
    model, prompt, max_tokens: 24, temperature: 0, ignore_eos: true, stream: true,
    stream_options: { include_usage: true },
  });
  let text = "", usage = null, finish = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.text ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  check(text === observed.greedy_text, `streamed text equals non-streamed: ${JSON.stringify(text)} vs ${JSON.stringify(observed.greedy_text)}`);
  check(finish === "length", "streamed finish_reason");
  check(usage && usage.completion_tokens === 24, "usage chunk");
  check(chunks >= 3, "several chunks");
}

// Token-id prompts, and logprobs (completions: integer N).
{
  const ids = [11, 22, 33, 44, 55];
  const r = await client.completions.create({
    model, prompt: ids, max_tokens: 5, temperature: 0, ignore_eos: true, logprobs: 2,
  });
  check(r.usage.prompt_tokens === ids.length, "token-id prompt counted");
  const lp = r.choices[0].logprobs;
  check(lp && lp.tokens.length === 5 && lp.token_logprobs.length === 5, "completion logprobs");
  check(lp.top_logprobs.length === 5 && Object.keys(lp.top_logprobs[0]).length >= 1, "top_logprobs");
  for (const v of lp.token_logprobs) check(v <= 0, "logprob <= 0");
  // Greedy: the chosen token is the most likely one.
  const best = Math.max(...Object.values(lp.top_logprobs[0]));
  check(Math.abs(best - lp.token_logprobs[0]) < 1e-4, "greedy picks the top logprob");
}

// Chat, not streamed and streamed, with logprobs.
{
  const messages = [{ role: "user", content: "Who made the heaven and the earth?" }];
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 16, temperature: 0, logprobs: true, top_logprobs: 2,
  });
  check(r.object === "chat.completion", "chat object");
  check(r.choices[0].message.role === "assistant", "assistant role");
  check(typeof r.choices[0].message.content === "string", "chat content");
  check(r.choices[0].logprobs.content.length === r.usage.completion_tokens, "chat logprobs per token");
  observed.chat_text = r.choices[0].message.content;
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 16, temperature: 0, stream: true,
  });
  let text = "", role = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      text += c.delta.content ?? "";
    }
  }
  check(role === "assistant", "streamed role");
  check(text === observed.chat_text, `streamed chat equals non-streamed: ${JSON.stringify(text)} vs ${JSON.stringify(observed.chat_text)}`);
}

// Stop strings: the output ends before the stop string, finish_reason stop.
{
  const full = observed.greedy_text;
  // A stop string taken from the middle of the greedy text.
  const at = Math.floor(full.length / 2);
  const stop = full.slice(at, at + 3);
  const cut = full.indexOf(stop);
  const r = await client.completions.create({
    model, prompt, max_tokens: 24, temperature: 0, ignore_eos: true, stop: [stop],
  });
  check(r.choices[0].finish_reason === "stop", `stop finish_reason, got ${r.choices[0].finish_reason}`);
  check(r.choices[0].text === full.slice(0, cut), `text cut before the stop string: ${JSON.stringify(r.choices[0].text)} vs ${JSON.stringify(full.slice(0, cut))}`);
}

// n = 2 with sampling: two choices, each of max_tokens tokens; reproducible with a seed.
{
  const req = { model, prompt, max_tokens: 12, temperature: 1.0, n: 2, seed: 7, ignore_eos: true };
  const a = await client.completions.create(req);
  const b = await client.completions.create(req);
  check(a.choices.length === 2, "n=2 choices");
  check(a.choices.map((c) => c.index).sort().join(",") === "0,1", "choice indexes");
  check(a.usage.completion_tokens === 24, `n=2 usage, got ${a.usage.completion_tokens}`);
  const texts = (x) => x.choices.sort((p, q) => p.index - q.index).map((c) => c.text);
  check(JSON.stringify(texts(a)) === JSON.stringify(texts(b)), "seeded sampling reproducible");
  observed.n2_distinct = texts(a)[0] !== texts(a)[1];
}

// 32 concurrent clients: every one completes with its own greedy text.
{
  const jobs = [];
  for (let i = 0; i < 32; i++) {
    jobs.push(client.completions.create({
      model, prompt: i % 2 ? prompt : "And the earth was", max_tokens: 8, temperature: 0,
      ignore_eos: true,
    }));
  }
  const rs = await Promise.all(jobs);
  const even = rs.filter((_, i) => i % 2 === 0).map((r) => r.choices[0].text);
  const odd = rs.filter((_, i) => i % 2 === 1).map((r) => r.choices[0].text);
  check(rs.every((r) => r.usage.completion_tokens === 8), "32 concurrent: lengths");
  check(new Set(odd).size === 1 && odd[0] === observed.greedy_text.slice(0, odd[0].length), "32 concurrent: odd agree with the single run");
  check(new Set(even).size === 1, "32 concurrent: even agree with each other");
}

// Cancellation by disconnect: abort a long stream after its first chunk.
{
  const controller = new AbortController();
  const stream = await client.completions.create(
    { model, prompt, max_tokens: 400, temperature: 0, ignore_eos: true, stream: true },
    { signal: controller.signal },
  );
  let got = 0;
  try {
    for await (const chunk of stream) {
      got++;
      if (got === 2) controller.abort();
    }
  } catch (e) {
    // AbortError expected
  }
  check(got >= 2, "received chunks before the abort");
  observed.cancelled = true;
}

console.log(JSON.stringify(observed));
