// The chat page: conversations in the sidebar, the selected one in the middle, a composer that
// streams /v1/chat/completions (or /v1/responses while a server-run tool is switched on), a Stop
// button that aborts the request (the server then frees the sequence), settings and the server
// view in side drawers.

import { $, h } from './dom.js';
import { apiKey, streamChat, streamResponse } from './api.js';
import { AssistantView, userView } from './messages.js';
import { ServerView } from './server.js';
import { Store, exportConversation } from './store.js';
import { ask } from './dialog.js';
import { applyEvent, offeredTools, renderSwitches, responsesBody, settleCalls } from './tools.js';

const DEFAULTS = 'gpt-oss-server.defaults';
const store = new Store();
const page = {
  conversation: null,
  controller: null,
  facts: null,
  asking: null,
  server: null,
  model: null,  // the model chosen in the menu (several served), else the server's
};

/** Settings for a new conversation: the server's defaults, then what was chosen last. */
function defaults() {
  const base = {
    instructions: '',
    effort: (page.facts && page.facts.reasoning_effort) || 'medium',
    temperature: page.facts ? page.facts.temperature : 1,
    tools: [],
  };
  try {
    return { ...base, ...JSON.parse(localStorage.getItem(DEFAULTS) || '{}') };
  } catch {
    return base;
  }
}

function settings() {
  return page.conversation ? page.conversation.settings : defaults();
}

// API key ------------------------------------------------------------------------------------

async function askKey() {
  if (page.asking) return page.asking;
  page.asking = ask({
    title: 'API key',
    message: 'This server needs an API key. It is kept for this tab only.',
    input: { type: 'password', placeholder: 'sk-…' },
    ok: 'Use key',
  }).then(async (key) => {
    page.asking = null;
    if (key) {
      apiKey.set(key.trim());
      await loadFacts();
    }
    return key;
  });
  return page.asking;
}

async function loadFacts() {
  try {
    page.facts = await page.server.loadFacts();
    page.server.setStatus('ok');
    $('model-name').textContent = page.facts.model;
    renderModels();
    renderTools();
  } catch (error) {
    page.server.setStatus(error.status === 401 ? 'locked' : 'down');
    if (error.status === 401) await askKey();
  }
}

/** The models menu, when the server serves several (/v1/server's `models`); the choice is
 * what requests name (`facts.chosen`). */
function renderModels() {
  const select = $('model-choice');
  const models = page.facts.models || [];
  const several = models.length > 1;
  select.hidden = !several;
  $('model-name').hidden = several;
  if (!models.some((m) => m.id === page.model)) page.model = page.facts.model;
  page.facts.chosen = page.model;
  if (!several) return;
  select.replaceChildren(...models.map((m) => h('option', { value: m.id, text: m.id })));
  select.value = page.model;
}

function chooseModel(id) {
  page.model = id;
  if (page.facts) page.facts.chosen = id;
}

// Conversations --------------------------------------------------------------------------------

function renderSidebar() {
  const items = store.conversations.filter((c) => c.messages.length).map((c) => h('button', {
    type: 'button',
    class: `conversation${page.conversation === c ? ' active' : ''}`,
    'data-id': c.id,
    title: c.title,
    onclick: () => { select(c); closeSidebar(); },
  }, h('span', { class: 'conversation-title', text: c.title }),
  h('span', { class: 'conversation-time', text: when(c.updated) })));
  $('conversations').replaceChildren(...(items.length ? items
    : [h('p', { class: 'no-conversations', text: 'No conversations yet.' })]));
}

function when(time) {
  const date = new Date(time);
  return date.toDateString() === new Date().toDateString()
    ? date.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' })
    : date.toLocaleDateString([], { month: 'short', day: 'numeric' });
}

function select(conversation) {
  if (page.controller) page.controller.abort();
  page.conversation = conversation;
  if (conversation) store.currentId = conversation.id;
  const s = settings();
  $('effort').value = s.effort;
  $('instructions').value = s.instructions;
  $('temperature').value = s.temperature;
  $('temperature-value').textContent = Number(s.temperature).toFixed(2);
  renderTools();
  $('chat-title').textContent = conversation ? conversation.title : 'New chat';
  for (const id of ['rename', 'export', 'delete']) $(id).disabled = !conversation;
  const views = (conversation ? conversation.messages : []).map((m) => (m.role === 'user'
    ? userView(m) : new AssistantView(m, reasoningLabel()).root));
  $('messages').replaceChildren(...(views.length ? views : [emptyState()]));
  $('messages').scrollTop = $('messages').scrollHeight;
  renderSidebar();
}

function emptyState() {
  return page.emptyState;
}

function reasoningLabel() {
  return page.facts && page.facts.reasoning_visibility === 'summary' ? 'Reasoning summary' : 'Thinking';
}

/** The tools switched on that this server offers: what the next request sends. */
function activeTools() {
  const active = settings().tools || [];
  return offeredTools(page.facts).filter((t) => active.includes(t.key));
}

function renderTools() {
  const offered = offeredTools(page.facts);
  renderSwitches($('tools'), offered, activeTools().map((t) => t.key), (key, on) => {
    const others = (settings().tools || []).filter((k) => k !== key);
    changeSetting('tools', on ? [...others, key] : others);
    renderTools();
  });
}

function changeSetting(name, value) {
  const s = { ...settings(), [name]: value };
  localStorage.setItem(DEFAULTS, JSON.stringify(s));
  if (page.conversation) {
    page.conversation.settings = s;
    store.save();
  }
}

async function rename() {
  const c = page.conversation;
  const title = await ask({ title: 'Rename conversation', input: { value: c.title }, ok: 'Rename' });
  if (!title || !title.trim()) return;
  c.title = title.trim().slice(0, 120);
  store.save();
  $('chat-title').textContent = c.title;
  renderSidebar();
}

async function remove() {
  const c = page.conversation;
  const ok = await ask({ title: 'Delete conversation?', message: `“${c.title}” will be removed from this browser.`, ok: 'Delete', danger: true });
  if (ok === null) return;
  store.remove(c.id);
  select(null);
}

// Sending ------------------------------------------------------------------------------------

function requestBody(conversation) {
  const s = conversation.settings;
  const messages = [];
  if (s.instructions.trim()) messages.push({ role: 'system', content: s.instructions });
  for (const m of conversation.messages.slice(0, -1)) {
    if (m.role === 'user') messages.push({ role: 'user', content: m.content });
    else if (m.content && m.trace) {
      messages.push({ role: 'assistant', content: m.content });  // its reasoning was split by tool calls
    } else if (m.content) {
      // The reasoning goes back with the answer: the server replays the exact tokens it
      // sampled, so the conversation's KV cache is reused.
      messages.push(m.reasoning ? { role: 'assistant', content: m.content, reasoning: m.reasoning }
        : { role: 'assistant', content: m.content });
    }
  }
  const body = {
    messages,
    stream: true,
    stream_options: { include_usage: true },
    reasoning: { effort: s.effort },
    temperature: Number(s.temperature),
  };
  if (page.facts) body.model = page.facts.chosen || page.facts.model;
  return body;
}

function titleOf(text) {
  const line = text.replace(/\s+/g, ' ').trim();
  return line.length > 48 ? `${line.slice(0, 47)}…` : line;
}

function streaming(on) {
  $('send').hidden = on;
  $('stop').hidden = !on;
  $('input').placeholder = on ? 'Generating… press Stop to cancel' : 'Message the model…';
}

function nearBottom() {
  const el = $('messages');
  return el.scrollHeight - el.scrollTop - el.clientHeight < 120;
}

function follow(wasNearBottom) {
  if (wasNearBottom) $('messages').scrollTop = $('messages').scrollHeight;
}

function apply(chunk, message, started) {
  const choice = chunk.choices && chunk.choices[0];
  const delta = (choice && choice.delta) || {};
  if (delta.reasoning) message.reasoning += delta.reasoning;
  if (delta.content) {
    if (!message.content && message.reasoning) message.thoughtMs = performance.now() - started;
    message.content += delta.content;
  }
  if (chunk.usage) message.stats = { usage: chunk.usage, timings: chunk.timings };
  if (message.content) message.state = 'answering';
  else if (message.reasoning) message.state = 'thinking';
}

async function send() {
  const text = $('input').value.trim();
  if (!text || page.controller) return;
  if (!page.conversation) {
    page.conversation = store.create(defaults());
    store.currentId = page.conversation.id;
    $('messages').replaceChildren();
    for (const id of ['rename', 'export', 'delete']) $(id).disabled = false;
  }
  const conversation = page.conversation;
  if (!conversation.messages.length) conversation.title = titleOf(text);
  $('chat-title').textContent = conversation.title;
  conversation.messages.push({ role: 'user', content: text });
  const message = { role: 'assistant', content: '', reasoning: '', state: 'waiting' };
  conversation.messages.push(message);
  store.save(conversation);
  renderSidebar();
  $('input').value = '';
  resizeInput();
  const view = new AssistantView(message, reasoningLabel());
  view.root.dataset.state = 'waiting';
  $('messages').append(userView({ content: text }), view.root);
  follow(true);
  await generate(conversation, message, view);
}

async function generate(conversation, message, view) {
  const controller = new AbortController();
  page.controller = controller;
  streaming(true);
  const started = performance.now();
  const tools = activeTools().map((t) => t.tool);
  try {
    if (tools.length) {
      message.trace = [];
      const body = responsesBody(conversation, tools, page.facts);
      for await (const event of streamResponse(body, controller.signal)) {
        const wasNearBottom = nearBottom();
        applyEvent(event, message, started);
        view.update(message);
        follow(wasNearBottom);
      }
    } else {
      for await (const chunk of streamChat(requestBody(conversation), controller.signal)) {
        const wasNearBottom = nearBottom();
        apply(chunk, message, started);
        view.update(message);
        follow(wasNearBottom);
      }
    }
    message.state = 'done';
  } catch (error) {
    if (error.name === 'AbortError') {
      message.state = 'stopped';
    } else {
      message.state = 'error';
      message.error = error.status === 401 ? 'The server needs a valid API key.' : error.message;
      if (error.status === 401) askKey();
    }
  } finally {
    settleCalls(message);
    message.elapsedMs = performance.now() - started;
    if (page.controller === controller) {
      page.controller = null;
      streaming(false);
    }
    store.save(conversation);
    renderSidebar();
    view.update(message, { live: false });
    view.root.dataset.state = message.state;
  }
}

// Wiring ---------------------------------------------------------------------------------------

function resizeInput() {
  const input = $('input');
  input.style.height = 'auto';
  input.style.height = `${Math.min(input.scrollHeight, 220)}px`;
}

function openSidebar() { $('sidebar').classList.add('open'); $('scrim').hidden = false; }
function closeSidebar() { $('sidebar').classList.remove('open'); $('scrim').hidden = true; }

function toggleDrawer(id) {
  const opening = $(id).hidden;
  closeDrawers();
  if (!opening) return;
  if (id === 'server-panel') page.server.open();
  else $(id).hidden = false;
  $(id === 'server-panel' ? 'toggle-server' : 'toggle-settings').setAttribute('aria-expanded', 'true');
}

function closeDrawers() {
  page.server.close();
  $('settings-panel').hidden = true;
  for (const id of ['toggle-server', 'toggle-settings']) $(id).setAttribute('aria-expanded', 'false');
}

function bind() {
  $('composer').addEventListener('submit', (event) => { event.preventDefault(); send(); });
  $('input').addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  $('input').addEventListener('input', resizeInput);
  $('stop').addEventListener('click', () => page.controller && page.controller.abort());
  $('new-chat').addEventListener('click', () => { select(null); closeSidebar(); $('input').focus(); });
  $('rename').addEventListener('click', rename);
  $('delete').addEventListener('click', remove);
  $('export').addEventListener('click', () => exportConversation(page.conversation));
  $('menu').addEventListener('click', openSidebar);
  $('scrim').addEventListener('click', closeSidebar);
  $('toggle-settings').addEventListener('click', () => toggleDrawer('settings-panel'));
  $('toggle-server').addEventListener('click', () => toggleDrawer('server-panel'));
  for (const button of document.querySelectorAll('[data-close]')) button.addEventListener('click', closeDrawers);
  document.addEventListener('keydown', (event) => { if (event.key === 'Escape') { closeDrawers(); closeSidebar(); } });
  $('effort').addEventListener('change', (event) => changeSetting('effort', event.target.value));
  $('model-choice').addEventListener('change', (event) => chooseModel(event.target.value));
  $('instructions').addEventListener('change', (event) => changeSetting('instructions', event.target.value));
  $('temperature').addEventListener('input', (event) => {
    $('temperature-value').textContent = Number(event.target.value).toFixed(2);
    changeSetting('temperature', Number(event.target.value));
  });
  $('forget-key').addEventListener('click', () => { apiKey.clear(); loadFacts(); });
  for (const chip of document.querySelectorAll('#examples .chip')) {
    chip.addEventListener('click', () => { $('input').value = chip.textContent.trim(); resizeInput(); $('input').focus(); });
  }
}

async function main() {
  page.emptyState = $('empty');
  page.server = new ServerView(askKey);
  bind();
  select(store.get(store.currentId));
  await loadFacts();
  if (!page.controller) select(page.conversation);  // the server's defaults and policy are known now
  document.body.dataset.ready = 'true';
}

main();
