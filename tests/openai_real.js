// openai_real.js — the official `openai` npm client against a real
// `moeserve serve` (random tiny model: the text is arbitrary, so this checks
// shapes, counts and finish reasons, not words).  Used by tests/t_serve.sh.
// Usage: node tests/openai_real.js BASE_URL   (e.g. http://127.0.0.1:30000/v1)
const path = require('path');
const OpenAI = require(path.join(__dirname, 'fixtures/node/node_modules/openai'));
const client = new OpenAI({ baseURL: process.argv[2], apiKey: 'none', maxRetries: 0, timeout: 60000 });
let passed = 0, failed = 0;
async function t(name, fn) {
  try { await fn(); passed++; console.error('ok   ' + name); }
  catch (e) { failed++; console.error('FAIL ' + name + ': ' + (e && e.stack || e)); }
}
function check(c, what) { if (!c) throw new Error(what); }
(async () => {
  let model = '';
  await t('models', async () => {
    const m = await client.models.list();
    model = m.data[0].id;
    check(typeof model === 'string' && model.length, 'model id');
  });
  await t('chat', async () => {
    const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 8, temperature: 0, ignore_eos: true });
    check(typeof r.choices[0].message.content === 'string', 'content');
    check(r.choices[0].finish_reason === 'length', 'finish ' + r.choices[0].finish_reason);
    check(r.usage.completion_tokens === 8 && r.usage.prompt_tokens > 0, 'usage ' + JSON.stringify(r.usage));
  });
  await t('chat stream + usage', async () => {
    const s = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 6, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } });
    let finish = null, usage = null, n = 0;
    for await (const c of s) {
      if (c.usage) usage = c.usage;
      if (c.choices.length) { n++; finish = c.choices[0].finish_reason || finish; }
    }
    check(n >= 2 && finish === 'length' && usage && usage.completion_tokens === 6, `n=${n} finish=${finish} usage=${JSON.stringify(usage)}`);
  });
  await t('completions greedy is repeatable', async () => {
    const a = await client.completions.create({ model, prompt: 'The quick brown fox', max_tokens: 6, temperature: 0, ignore_eos: true });
    const b = await client.completions.create({ model, prompt: 'The quick brown fox', max_tokens: 6, temperature: 0, ignore_eos: true });
    check(a.choices[0].text === b.choices[0].text, 'greedy text differs');
    check(a.usage.completion_tokens === 6, 'usage');
  });
  await t('context error', async () => {
    let err = null;
    try { await client.completions.create({ model, prompt: 'x', max_tokens: 100000000 }); } catch (e) { err = e; }
    check(err instanceof OpenAI.BadRequestError, 'expected BadRequestError, got ' + err);
  });
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
})();
