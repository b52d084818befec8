// openai_client.js — drives the echo server with the official `openai` npm
// client (installed by: npm install --prefix tests/fixtures/node openai@4).
// Usage: node tests/openai_client.js PORT   Prints "N passed, N failed".
const path = require('path');
const OpenAI = require(path.join(__dirname, 'fixtures/node/node_modules/openai'));
const port = process.argv[2];
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'k', maxRetries: 0, timeout: 10000 });
let passed = 0, failed = 0;
async function t(name, fn) {
  try { await fn(); passed++; console.error('ok   ' + name); }
  catch (e) { failed++; console.error('FAIL ' + name + ': ' + (e && e.stack || e)); }
}
function eq(a, b, what) { if (JSON.stringify(a) !== JSON.stringify(b)) throw new Error(`${what}: got ${JSON.stringify(a)}, want ${JSON.stringify(b)}`); }
const CB = '<｜tool▁calls▁begin｜>', C1 = '<｜tool▁call▁begin｜>', SEP = '<｜tool▁sep｜>', CE = '<｜tool▁call▁end｜>', CSE = '<｜tool▁calls▁end｜>';
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
(async () => {
  await t('models', async () => {
    const m = await client.models.list();
    eq(m.data[0].id, 'echo-model', 'model id');
  });
  await t('chat', async () => {
    const r = await client.chat.completions.create({ model: 'echo-model', messages: [{ role: 'user', content: 'Hello there' }], max_tokens: 50 });
    eq(r.choices[0].message.content, 'Hello there', 'content');
    eq(r.choices[0].finish_reason, 'stop', 'finish');
    eq(r.usage.completion_tokens, 12, 'completion tokens');
  });
  await t('chat stream + usage', async () => {
    const s = await client.chat.completions.create({ model: 'echo-model', messages: [{ role: 'user', content: 'Stream me' }], stream: true, stream_options: { include_usage: true } });
    let text = '', finish = null, usage = null;
    for await (const c of s) {
      if (c.usage) usage = c.usage;
      if (c.choices.length) { text += c.choices[0].delta.content || ''; finish = c.choices[0].finish_reason || finish; }
    }
    eq(text, 'Stream me', 'text'); eq(finish, 'stop', 'finish'); eq(usage.completion_tokens, 10, 'usage');
  });
  await t('completions', async () => {
    const r = await client.completions.create({ model: 'echo-model', prompt: 'abcdef', max_tokens: 3 });
    eq(r.choices[0].text, 'abc', 'text'); eq(r.choices[0].finish_reason, 'length', 'finish');
    eq(r.usage.prompt_tokens, 6, 'prompt tokens');
  });
  await t('completions stream', async () => {
    const s = await client.completions.create({ model: 'echo-model', prompt: 'xyz', max_tokens: 10, stream: true });
    let text = '';
    for await (const c of s) text += c.choices[0].text;
    eq(text, 'xyz', 'text');
  });
  await t('tool calls', async () => {
    const r = await client.chat.completions.create({ model: 'echo-model', tools, messages: [{ role: 'user', content: `${CB}${C1}get_weather${SEP}{"city": "Oslo"}${CE}${CSE}` }] });
    const tc = r.choices[0].message.tool_calls;
    eq(tc[0].function.name, 'get_weather', 'name'); eq(JSON.parse(tc[0].function.arguments), { city: 'Oslo' }, 'args');
    eq(r.choices[0].finish_reason, 'tool_calls', 'finish');
  });
  await t('tool calls stream', async () => {
    const s = await client.chat.completions.create({ model: 'echo-model', tools, stream: true, messages: [{ role: 'user', content: `${CB}${C1}get_weather${SEP}{"city": "Rome"}${CE}${CSE}` }] });
    let name = '', args = '', finish = null;
    for await (const c of s) {
      const d = c.choices[0].delta;
      for (const tc of d.tool_calls || []) { name += tc.function.name || ''; args += tc.function.arguments || ''; }
      finish = c.choices[0].finish_reason || finish;
    }
    eq(name, 'get_weather', 'name'); eq(JSON.parse(args), { city: 'Rome' }, 'args'); eq(finish, 'tool_calls', 'finish');
  });
  await t('errors', async () => {
    let err = null;
    try { await client.chat.completions.create({ model: 'echo-model', messages: [{ role: 'user', content: 'x' }], max_tokens: 5000 }); } catch (e) { err = e; }
    if (!(err instanceof OpenAI.BadRequestError)) throw new Error('expected BadRequestError, got ' + err);
    if (!/maximum context length/.test(err.message)) throw new Error('message: ' + err.message);
    const bad = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'wrong', maxRetries: 0 });
    err = null;
    try { await bad.models.list(); } catch (e) { err = e; }
    if (!(err instanceof OpenAI.AuthenticationError)) throw new Error('expected AuthenticationError, got ' + err);
  });
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
})();
