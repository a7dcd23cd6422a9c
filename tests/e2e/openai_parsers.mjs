// One chat request through the official OpenAI npm client, not streamed and streamed, for
// serve_parsers_test.py (which holds the expected values and compares).
// Usage: node openai_parsers.mjs BASE_URL API_KEY MODEL REQUEST_JSON
// REQUEST_JSON: the request's fields besides `model` and `stream` (messages, tools, ...).
// Prints one JSON object: {whole: OBSERVED, streamed: OBSERVED}, where OBSERVED is
// {content, reasoning_content, tool_calls: [{id, type, name, arguments}], finish_reason,
// chunks}; content is null when the message's content was null. Exits non-zero when the
// client itself fails or a response is not shaped as the API says.
import { createRequire } from "node:module";

// The client pinned in tools/npm (installed by tools/install_deps.sh; nothing is downloaded).
const require = createRequire(new URL("../../tools/npm/package.json", import.meta.url));
const OpenAI = require("openai");

const [baseURL, apiKey, model, requestJson] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
const request = JSON.parse(requestJson);

function check(cond, what) {
  if (!cond) {
    console.error(`FAILED: ${what}`);
    process.exit(1);
  }
}

const observed = {};

{
  const r = await client.chat.completions.create({ ...request, model });
  check(r.object === "chat.completion", "chat object");
  check(r.choices.length === 1, "one choice");
  const m = r.choices[0].message;
  check(m.role === "assistant", "assistant role");
  observed.whole = {
    content: m.content,
    reasoning_content: m.reasoning_content ?? null,
    tool_calls: (m.tool_calls ?? []).map((c) => ({
      id: c.id, type: c.type, name: c.function.name, arguments: c.function.arguments,
    })),
    finish_reason: r.choices[0].finish_reason,
    chunks: 1,
  };
}

{
  const stream = await client.chat.completions.create({ ...request, model, stream: true });
  let content = "", reasoning = "", finish = null, chunks = 0, sawReasoning = false;
  const calls = [];  // by index
  for await (const chunk of stream) {
    chunks++;
    for (const c of chunk.choices) {
      content += c.delta.content ?? "";
      if (typeof c.delta.reasoning_content === "string") {
        sawReasoning = true;
        reasoning += c.delta.reasoning_content;
      }
      for (const t of c.delta.tool_calls ?? []) {
        check(Number.isInteger(t.index), "tool call delta has an index");
        calls[t.index] ??= { id: "", type: "", name: "", arguments: "" };
        const acc = calls[t.index];
        if (t.id) acc.id = t.id;
        if (t.type) acc.type = t.type;
        acc.name += t.function?.name ?? "";
        acc.arguments += t.function?.arguments ?? "";
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  check(calls.every((c) => c !== undefined), "tool call indexes without gaps");
  observed.streamed = {
    content,
    reasoning_content: sawReasoning ? reasoning : null,
    tool_calls: calls,
    finish_reason: finish,
    chunks,
  };
}

console.log(JSON.stringify(observed));
