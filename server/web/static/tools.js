// The server-run tools on the chat page: a switch for each tool the operator turned on (from
// /v1/server's `tools`), the /v1/responses request a turn becomes while one is on, and OpenAI's
// Responses events folded into the message: reasoning and tool calls in order (`trace`), the
// answer, the usage.

import { h } from './dom.js';

/** The switches the server offers: [{key, label, tool}] where `tool` is what a request sends. */
export function offeredTools(facts) {
  const tools = (facts && facts.tools) || {};
  const offered = [];
  if (tools.code_interpreter) {
    offered.push({ key: 'code_interpreter', label: 'Python', tool: { type: 'code_interpreter', container: { type: 'auto' } } });
  }
  if (tools.web_search) {
    offered.push({ key: 'web_search', label: 'Web search', tool: { type: 'web_search' } });
  }
  for (const label of tools.mcp || []) {
    // The switch is the user's consent to this server's calls: none waits for an approval.
    offered.push({ key: `mcp:${label}`, label, tool: { type: 'mcp', server_label: label, require_approval: 'never' } });
  }
  return offered;
}

/** The switch buttons; `onToggle(key, on)` when one is pressed. */
export function renderSwitches(container, offered, active, onToggle) {
  container.replaceChildren(...offered.map(({ key, label }) => {
    const on = active.includes(key);
    return h('button', {
      type: 'button',
      class: 'tool-switch',
      'data-tool': key,
      'aria-pressed': on ? 'true' : 'false',
      title: `${on ? 'Turn off' : 'Turn on'} ${label} for the next messages (run by the server)`,
      onclick: () => onToggle(key, !on),
    }, h('span', { class: 'tool-dot', 'aria-hidden': 'true' }), h('span', { text: label }));
  }));
  container.hidden = !offered.length;
}

/** The /v1/responses request of a conversation's last turn, with the switched-on `tools`. */
export function responsesBody(conversation, tools, facts) {
  const s = conversation.settings;
  const input = [];
  for (const m of conversation.messages.slice(0, -1)) {
    if (m.role === 'user') input.push({ type: 'message', role: 'user', content: m.content });
    else if (m.content) input.push({ type: 'message', role: 'assistant', content: m.content });
  }
  const body = {
    input,
    tools,
    stream: true,
    store: false,
    reasoning: { effort: s.effort },
    temperature: Number(s.temperature),
  };
  if (facts && facts.reasoning_visibility === 'summary') body.reasoning.summary = 'auto';
  if (s.instructions.trim()) body.instructions = s.instructions;
  if (facts) body.model = facts.chosen || facts.model;
  return body;
}

const CALLS = new Set(['code_interpreter_call', 'web_search_call', 'mcp_call']);

function toolOf(message, id) {
  return (message.trace || []).find((entry) => entry.kind === 'tool' && entry.id === id);
}

function addReasoning(message, text) {
  const trace = message.trace;
  const last = trace[trace.length - 1];
  if (last && last.kind === 'text') last.text += text;
  else trace.push({ kind: 'text', text });
  message.reasoning += text;
}

/** What a finished call item shows: its input (code, query, arguments) and its output. */
function fill(entry, item) {
  entry.status = item.status || entry.status;
  if (item.type === 'code_interpreter_call') {
    if (item.code !== undefined && item.code !== null) entry.input = item.code;
    entry.output = (item.outputs || []).map((o) => (o.type === 'logs' ? o.logs : `[${o.type}]`)).join('');
  } else if (item.type === 'web_search_call') {
    const action = item.action || {};
    entry.action = action.type || 'search';
    if (action.type === 'open_page') entry.input = action.url || '';
    else if (action.type === 'find_in_page') entry.input = `“${action.pattern || ''}” in ${action.url || 'the page'}`;
    else entry.input = action.query || '';
    entry.output = (action.sources || []).map((source) => source.url || '').join('\n');
  } else if (item.type === 'mcp_call') {
    entry.input = item.arguments || entry.input;
    entry.output = item.output || '';
    if (item.error) entry.error = errorText(item.error);
  }
  if (entry.status === 'failed' && !entry.error && !entry.output) entry.error = 'The call failed.';
}

/** An `mcp_call` error as text: its message, else the text the tool returned, else the JSON. */
function errorText(error) {
  if (error.message) return error.message;
  const texts = (error.content || []).filter((part) => part.type === 'text').map((part) => part.text);
  return texts.length ? texts.join('\n') : JSON.stringify(error);
}

function opened(item) {
  const entry = { kind: 'tool', id: item.id, type: item.type, input: '', output: '', error: '', status: 'in_progress' };
  if (item.type === 'mcp_call') {
    entry.server = item.server_label;
    entry.name = item.name;
    entry.input = item.arguments || '';
  }
  if (item.type === 'web_search_call') entry.action = (item.action && item.action.type) || 'search';
  return entry;
}

/** Folds one Responses event into `message`; a failed response throws. */
export function applyEvent(event, message, started) {
  message.trace = message.trace || [];
  switch (event.type) {
    case 'response.reasoning_text.delta':
    case 'response.reasoning_summary_text.delta':
      addReasoning(message, event.delta);
      break;
    case 'response.output_text.delta':
      if (!message.content && message.reasoning) message.thoughtMs = performance.now() - started;
      message.content += event.delta;
      break;
    case 'response.output_item.added':
      if (CALLS.has(event.item.type)) message.trace.push(opened(event.item));
      break;
    case 'response.code_interpreter_call_code.delta':
    case 'response.mcp_call_arguments.delta': {
      const entry = toolOf(message, event.item_id);
      if (entry) entry.input += event.delta;
      break;
    }
    case 'response.code_interpreter_call_code.done': {
      const entry = toolOf(message, event.item_id);
      if (entry) entry.input = event.code;
      break;
    }
    case 'response.mcp_call_arguments.done': {
      const entry = toolOf(message, event.item_id);
      if (entry) entry.input = event.arguments;
      break;
    }
    case 'response.output_item.done': {
      const { item } = event;
      const entry = toolOf(message, item.id);
      if (entry) fill(entry, item);
      else if (item.type === 'mcp_list_tools' && item.error) {
        message.trace.push({
          kind: 'tool', id: item.id, type: 'mcp_list_tools', server: item.server_label, input: '',
          output: '', error: item.error, status: 'failed',
        });
      }
      break;
    }
    case 'response.completed':
    case 'response.incomplete': {
      const usage = event.response && event.response.usage;
      if (usage) {
        message.stats = {
          usage: {
            prompt_tokens: usage.input_tokens,
            completion_tokens: usage.output_tokens,
            completion_tokens_details: { reasoning_tokens: usage.output_tokens_details?.reasoning_tokens || 0 },
            prompt_tokens_details: { cached_tokens: usage.input_tokens_details?.cached_tokens || 0 },
          },
        };
      }
      break;
    }
    case 'response.failed': {
      const error = (event.response && event.response.error) || {};
      throw Object.assign(new Error(error.message || 'generation failed'), { status: 500 });
    }
    default:
      break;
  }
  const running = message.trace.some((e) => e.kind === 'tool' && !['completed', 'failed', 'incomplete'].includes(e.status));
  if (message.content) message.state = 'answering';
  else if (message.reasoning || running || message.trace.length) message.state = 'thinking';
}

/** A response that ended (stopped, failed, the page closed) leaves no call "running". */
export function settleCalls(message) {
  for (const entry of message.trace || []) {
    if (entry.kind === 'tool' && !['completed', 'failed', 'incomplete'].includes(entry.status)) {
      entry.status = 'incomplete';
    }
  }
}

const NAMES = {
  code_interpreter_call: () => 'Python',
  web_search_call: (entry) => ({ open_page: 'Open page', find_in_page: 'Find in page' }[entry.action] || 'Web search'),
  mcp_call: (entry) => `${entry.server} · ${entry.name}`,
  mcp_list_tools: (entry) => `${entry.server} · tools`,
};

function statusText(status) {
  if (status === 'completed') return 'done';
  if (status === 'failed') return 'failed';
  if (status === 'incomplete') return 'not run';
  return 'running…';
}

/** A tool call in the thinking panel, updated in place as its events arrive. */
export class ToolCallView {
  constructor() {
    this.name = h('span', { class: 'tool-name' });
    this.status = h('span', { class: 'tool-status' });
    this.input = h('pre', { class: 'tool-input' });
    this.output = h('pre', { class: 'tool-output' });
    this.error = h('pre', { class: 'tool-error' });
    this.root = h('div', { class: 'tool-call' },
      h('div', { class: 'tool-head' }, this.name, this.status), this.input, this.output, this.error);
  }

  update(entry) {
    this.root.dataset.type = entry.type;
    this.root.dataset.status = entry.status;
    set(this.name, (NAMES[entry.type] || (() => entry.type))(entry));
    set(this.status, statusText(entry.status));
    for (const part of ['input', 'output', 'error']) {
      set(this[part], entry[part] || '');
      this[part].hidden = !entry[part];
    }
  }
}

function set(element, text) {
  if (element.textContent !== text) element.textContent = text;
}
