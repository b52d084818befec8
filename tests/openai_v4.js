// openai_v4.js — the official `openai` npm client against the echo server as a
// DeepSeek-V4 model (test_http --serve --model-family deepseek_v4
// --tool-call-parser deepseekv4 --reasoning-parser deepseek-v4).  The echo
// engine replays the last user turn, so each request carries a hand-written
// model output: reasoning, DSML tool calls, content.
// Usage: node tests/openai_v4.js PORT   Prints "N passed, N failed".
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
const D = '｜DSML｜';
const call = (name, params) => `<${D}invoke name="${name}">\n` +
  params.map(([k, v, s]) => `<${D}parameter name="${k}" string="${s}">${v}</${D}parameter>`).join('\n') + `\n</${D}invoke>`;
const block = (...calls) => `\n\n<${D}tool_calls>\n${calls.join('\n')}\n</${D}tool_calls>`;
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Get the current weather for a location', parameters: { type: 'object', properties: { location: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } }, required: ['location'] } } }];
const thinking = { chat_template_kwargs: { thinking: true } };
(async () => {
  const out1 = 'The user wants the weather in Beijing.</think>' + block(call('get_weather', [['location', 'Beijing', 'true']]));
  await t('stream: reasoning_content, then a tool_calls delta (seed 001 3.2 client loop)', async () => {
    const s = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: out1 }], tools, stream: true, ...thinking });
    let reasoning = '', content = '', finish = null;
    const acc = {};
    for await (const c of s) {
      if (!c.choices.length) continue;
      const d = c.choices[0].delta;
      if (d.reasoning_content) reasoning += d.reasoning_content;
      if (d.content) content += d.content;
      for (const tc of d.tool_calls || []) {
        acc[tc.index] = acc[tc.index] || { name: null, arguments: '' };
        if (tc.function && tc.function.name) acc[tc.index].name = tc.function.name;
        if (tc.function && tc.function.arguments) acc[tc.index].arguments += tc.function.arguments;
      }
      if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
    }
    eq(reasoning, 'The user wants the weather in Beijing.', 'reasoning');
    eq(content, '', 'content');
    eq(Object.keys(acc).length, 1, 'calls');
    eq(acc[0].name, 'get_weather', 'name');
    eq(JSON.parse(acc[0].arguments), { location: 'Beijing' }, 'arguments');
    eq(finish, 'tool_calls', 'finish');
  });
  await t('non-stream: message.tool_calls and reasoning_content', async () => {
    const r = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: out1 }], tools, ...thinking });
    const m = r.choices[0].message;
    eq(m.reasoning_content, 'The user wants the weather in Beijing.', 'reasoning');
    eq(m.content, null, 'content');
    eq(m.tool_calls.length, 1, 'calls');
    eq(m.tool_calls[0].type, 'function', 'type');
    eq(m.tool_calls[0].function.name, 'get_weather', 'name');
    eq(m.tool_calls[0].function.arguments, '{"location": "Beijing"}', 'arguments');
    eq(r.choices[0].finish_reason, 'tool_calls', 'finish');
  });
  await t('stream: two calls, JSON parameters, content before the block', async () => {
    const out = 'Let me look both up.' + block(call('get_weather', [['location', 'Oslo', 'true'], ['unit', 'celsius', 'true']]),
      call('get_weather', [['location', 'Rome', 'true'], ['days', '3', 'false'], ['hours', '[6, 12]', 'false']]));
    const s = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: out }], tools, stream: true });
    let content = '', finish = null;
    const acc = {};
    for await (const c of s) {
      if (!c.choices.length) continue;
      const d = c.choices[0].delta;
      if (d.content) content += d.content;
      for (const tc of d.tool_calls || []) {
        acc[tc.index] = acc[tc.index] || { id: tc.id, name: '', arguments: '' };
        if (tc.function && tc.function.name) acc[tc.index].name += tc.function.name;
        if (tc.function && tc.function.arguments) acc[tc.index].arguments += tc.function.arguments;
      }
      if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
    }
    eq(content, 'Let me look both up.', 'content');
    eq(JSON.parse(acc[0].arguments), { location: 'Oslo', unit: 'celsius' }, 'call 0');
    eq(JSON.parse(acc[1].arguments), { location: 'Rome', days: 3, hours: [6, 12] }, 'call 1');
    eq(acc[0].id !== acc[1].id, true, 'distinct ids');
    eq(finish, 'tool_calls', 'finish');
  });
  await t('non-think (the default) with reasoning_effort max: all content', async () => {
    const r = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: '36' }], reasoning_effort: 'max' });
    eq(r.choices[0].message.content, '36', 'content');
    eq(r.choices[0].message.reasoning_content, null, 'reasoning');
  });
  await t('history: tool results merge into the user turn (V4 encoding)', async () => {
    const r = await client.chat.completions.create({ model: 'm', tools, messages: [
      { role: 'user', content: 'Weather in Oslo and Rome?' },
      { role: 'assistant', content: null, tool_calls: [
        { id: 'a', type: 'function', function: { name: 'get_weather', arguments: '{"location": "Oslo"}' } },
        { id: 'b', type: 'function', function: { name: 'get_weather', arguments: '{"location": "Rome"}' } }] },
      { role: 'tool', tool_call_id: 'b', content: '25C' },
      { role: 'tool', tool_call_id: 'a', content: '5C' },
      { role: 'user', content: 'Which is warmer?' }] });
    // the echo engine replays the last user turn as the prompt renders it
    eq(r.choices[0].message.content, '<tool_result>5C</tool_result>\n\n<tool_result>25C</tool_result>\n\nWhich is warmer?', 'user turn');
  });
  await t('bad reasoning_effort type: APIError 400', async () => {
    try { await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x' }], reasoning_effort: 5 }); throw new Error('no error'); }
    catch (e) { eq(e.status, 400, 'status'); }
  });
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
})();
