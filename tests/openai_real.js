// openai_real.js — the official `openai` npm client against a real moeserve
// server (random weights, so texts are arbitrary: checks are structural plus
// stream == non-stream for greedy decoding).
// Usage: node tests/openai_real.js BASE_URL   Prints "N passed, N failed".
const path = require('path');
const OpenAI = require(path.join(__dirname, 'fixtures/node/node_modules/openai'));
const client = new OpenAI({ baseURL: process.argv[2], apiKey: 'none', maxRetries: 0, timeout: 60000 });
let passed = 0, failed = 0;
async function t(name, fn) {
  try { await fn(); passed++; console.error('ok   ' + name); }
  catch (e) { failed++; console.error('FAIL ' + name + ': ' + (e && e.stack || e)); }
}
function ok(c, what) { if (!c) throw new Error(what); }
const msgs = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Name three colours.' }];
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
(async () => {
  let model = 'x', full = null;
  await t('models', async () => { const m = await client.models.list(); model = m.data[0].id; ok(model, 'model id'); });
  await t('chat non-stream', async () => {
    const r = await client.chat.completions.create({ model, messages: msgs, max_tokens: 10, temperature: 0 });
    full = r.choices[0].message.content;
    ok(r.choices[0].message.role === 'assistant', 'role');
    ok(r.usage.completion_tokens <= 10 && r.usage.prompt_tokens > 0, 'usage');
  });
  await t('chat stream equals non-stream, usage last', async () => {
    const s = await client.chat.completions.create({ model, messages: msgs, max_tokens: 10, temperature: 0, stream: true, stream_options: { include_usage: true } });
    let text = '', usage = null;
    for await (const c of s) { if (c.usage) usage = c.usage; if (c.choices.length) text += c.choices[0].delta.content || ''; }
    ok(text === full, `text ${JSON.stringify(text)} vs ${JSON.stringify(full)}`);
    ok(usage && usage.completion_tokens <= 10, 'usage chunk');
  });
  await t('completions with logprobs', async () => {
    const r = await client.completions.create({ model, prompt: 'The sky is', max_tokens: 4, temperature: 0, logprobs: 2 });
    ok(r.choices[0].finish_reason === 'length', 'finish');
    ok(r.choices[0].logprobs && r.choices[0].logprobs.tokens.length === 4, 'logprobs');
  });
  await t('tools accepted', async () => {
    const r = await client.chat.completions.create({ model, messages: msgs, max_tokens: 8, tools, temperature: 0 });
    ok(r.choices[0].message.role === 'assistant', 'role');
  });
  await t('seeded sampling reproducible', async () => {
    // a prompt shorter than one KV page: no prefix-cache reuse changes the numerics
    const a = await client.completions.create({ model, prompt: 'Hi', max_tokens: 8, temperature: 0.9, seed: 7 });
    const b = await client.completions.create({ model, prompt: 'Hi', max_tokens: 8, temperature: 0.9, seed: 7 });
    ok(a.choices[0].text === b.choices[0].text, 'same seed, same text');
  });
  await t('bad request surfaces as APIError 400', async () => {
    try { await client.chat.completions.create({ model, messages: 'nope' }); throw new Error('no error'); }
    catch (e) { ok(e.status === 400, `status ${e.status}`); }
  });
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
})();
