// Smoke test of a running server through the official `openai` npm client (installed by
// tools/install_deps.sh into tools/npm; nothing is downloaded here).
//
//   node tests/e2e/openai_client_smoke.mjs BASE_URL API_KEY [MODEL]
//   e.g. node tests/e2e/openai_client_smoke.mjs http://127.0.0.1:8000/v1 sk-test
//
// Checks a non-streamed and a streamed chat completion (with stream_options.include_usage)
// against the shapes of the OpenAI API reference. Exit status 0 when every check passed;
// otherwise 1, with what failed on stderr. MODEL defaults to the first of GET /v1/models.
import { createRequire } from 'node:module';

const require = createRequire(new URL('../../tools/npm/package.json', import.meta.url));
const OpenAI = require('openai');

const [baseURL, apiKey, modelArg] = process.argv.slice(2);
if (!baseURL || apiKey === undefined) {
  console.error('usage: openai_client_smoke.mjs BASE_URL API_KEY [MODEL]');
  process.exit(2);
}

const failures = [];
function check(cond, what) {
  if (!cond) failures.push(what);
}

const client = new OpenAI({ baseURL, apiKey: apiKey || 'none', maxRetries: 0, timeout: 60_000 });

async function main() {
  let model = modelArg;
  if (!model) {
    const models = await client.models.list();
    check(models.data.length > 0, 'GET /v1/models lists at least one model');
    model = models.data[0]?.id;
  }
  const messages = [{ role: 'user', content: 'Say hello.' }];

  // Non-streamed.
  const whole = await client.chat.completions.create({ model, messages, max_tokens: 8 });
  check(whole.object === 'chat.completion', `object is chat.completion (got ${whole.object})`);
  check(typeof whole.id === 'string' && whole.id.length > 0, 'id is a non-empty string');
  check(whole.model === model, `model echoes ${model} (got ${whole.model})`);
  check(whole.choices.length === 1, 'one choice');
  const choice = whole.choices[0];
  check(choice?.message?.role === 'assistant', 'message.role is assistant');
  check(typeof choice?.message?.content === 'string', 'message.content is a string');
  check(['stop', 'length'].includes(choice?.finish_reason), `finish_reason (got ${choice?.finish_reason})`);
  const u = whole.usage;
  check(u && u.prompt_tokens > 0, 'usage.prompt_tokens > 0');
  check(u && u.completion_tokens > 0 && u.completion_tokens <= 8, 'usage.completion_tokens in [1, 8]');
  check(u && u.total_tokens === u.prompt_tokens + u.completion_tokens, 'usage.total_tokens is the sum');

  // Streamed, with the usage chunk.
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 8, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let role = null;
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    check(chunk.object === 'chat.completion.chunk', `chunk object (got ${chunk.object})`);
    if (chunk.usage) {
      usage = chunk.usage;
      check(chunk.choices.length === 0, 'the usage chunk has empty choices');
    }
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      if (c.delta.content) text += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  check(chunks >= 2, `at least two chunks (got ${chunks})`);
  check(role === 'assistant', 'the first delta carries role assistant');
  check(['stop', 'length'].includes(finish), `streamed finish_reason (got ${finish})`);
  check(usage && usage.completion_tokens > 0, 'the usage chunk counts completion tokens');

  console.log(JSON.stringify({ model, whole: choice?.message?.content, streamed: text, usage }));
}

main()
  .catch((e) => failures.push(`request failed: ${e?.status ?? ''} ${e?.message ?? e}`))
  .finally(() => {
    if (failures.length) {
      console.error(`openai_client_smoke: ${failures.length} check(s) failed:\n  ${failures.join('\n  ')}`);
      process.exit(1);
    }
    console.log('openai_client_smoke: ok');
  });
