// One message on the page: the user's text, or the assistant's thinking panel (live reasoning,
// collapsed once the answer starts; with server-run tools the calls and their output inline
// between the reasoning), its Markdown answer and a line of numbers from the response's usage
// and timings.

import { count, duration, h } from './dom.js';
import { renderMarkdown } from './markdown.js';
import { ToolCallView } from './tools.js';

/** The element of a user message. */
export function userView(message) {
  return h('div', { class: 'message user', 'data-role': 'user' },
    h('div', { class: 'bubble', text: message.content }));
}

/** An assistant message that can be updated while it streams. */
export class AssistantView {
  constructor(message, reasoningLabel) {
    this.reasoningLabel = reasoningLabel;  // "Thinking" or "Reasoning summary"
    this.label = h('span', { class: 'thinking-label' });
    this.thinkingText = h('div', { class: 'thinking-text' });
    const summary = h('summary', {}, h('span', { class: 'pulse', 'aria-hidden': 'true' }), this.label);
    summary.addEventListener('click', () => { this.collapsed = true; });  // the reader decides now
    this.thinking = h('details', { class: 'thinking', hidden: true }, summary, this.thinkingText);
    this.answer = h('div', { class: 'answer markdown' });
    this.error = h('div', { class: 'error', hidden: true, role: 'alert' });
    this.stats = h('div', { class: 'stats' });
    this.root = h('div', { class: 'message assistant', 'data-role': 'assistant' },
      h('div', { class: 'avatar', 'aria-hidden': 'true' }),
      h('div', { class: 'body' }, this.thinking, this.answer, this.error, this.stats));
    this.collapsed = false;
    this.parts = null;  // with a trace: one view per entry (reasoning text, tool call)
    this.rendered = null;
    this.frame = null;
    this.update(message, { live: false });
  }

  /** Shows `message` as it is now; `live` while it streams (the answer re-renders once a frame). */
  update(message, { live = true } = {}) {
    const state = message.state || 'done';
    this.root.dataset.state = state;
    this.updateThinking(message, state, live);
    if (live) {
      if (this.frame === null) {
        this.frame = requestAnimationFrame(() => { this.frame = null; this.renderAnswer(message); });
      }
    } else {
      if (this.frame !== null) cancelAnimationFrame(this.frame);
      this.frame = null;
      this.renderAnswer(message);
    }
    this.error.hidden = !message.error;
    this.error.textContent = message.error || '';
    this.stats.replaceChildren(...statsOf(message));
  }

  updateThinking(message, state, live) {
    const reasoning = message.reasoning || '';
    const trace = message.trace || [];
    this.thinking.hidden = !reasoning && !trace.length;
    if (trace.length) this.renderTrace(trace);
    else if (this.thinkingText.textContent !== reasoning) this.thinkingText.textContent = reasoning;
    const thinking = state === 'thinking' || (state === 'waiting' && reasoning);
    this.thinking.classList.toggle('live', Boolean(thinking));
    if (!live && !this.collapsed) {  // a stored message: closed
      this.thinking.open = false;
      this.collapsed = Boolean(message.content);
    } else if (thinking && !this.collapsed) {
      this.thinking.open = true;
    } else if (message.content && !this.collapsed) {
      this.thinking.open = false;  // the answer has started
      this.collapsed = true;
    }
    this.label.textContent = thinking ? `${this.reasoningLabel}…` : thoughtLabel(message, this.reasoningLabel);
  }

  /** The reasoning and the tool calls in the order they came, each part updated in place. */
  renderTrace(trace) {
    if (this.parts === null) {
      this.parts = [];
      this.thinkingText.replaceChildren();
    }
    trace.forEach((entry, index) => {
      let part = this.parts[index];
      if (!part) {
        part = entry.kind === 'tool' ? new ToolCallView() : { root: h('div', { class: 'thinking-part' }) };
        this.parts.push(part);
        this.thinkingText.append(part.root);
      }
      if (part instanceof ToolCallView) part.update(entry);
      else if (part.root.textContent !== entry.text) part.root.textContent = entry.text;
    });
  }

  renderAnswer(message) {
    const content = message.content || '';
    if (content === this.rendered) return;
    this.rendered = content;
    this.answer.replaceChildren(renderMarkdown(content));
  }
}

function thoughtLabel(message, reasoningLabel) {
  if (reasoningLabel !== 'Thinking') return reasoningLabel;
  return message.thoughtMs ? `Thought for ${duration(message.thoughtMs)}` : 'Thoughts';
}

function statsOf(message) {
  const chip = (text, title) => h('span', { class: 'chip-stat', title, text });
  if (message.state === 'stopped') {
    return [chip(`Stopped after ${duration(message.elapsedMs || 0)}`, 'You pressed Stop')];
  }
  const { usage, timings } = message.stats || {};
  if (!usage) return [];
  const reasoning = usage.completion_tokens_details?.reasoning_tokens || 0;
  const cached = usage.prompt_tokens_details?.cached_tokens || 0;
  const chips = [
    chip(`${count(usage.completion_tokens)} tokens${reasoning ? ` (${count(reasoning)} thinking)` : ''}`,
      'Generated tokens, reasoning included'),
  ];
  if (timings) {
    chips.push(chip(`${duration(timings.ttft_ms)} to first token`, 'Time to first token, server side'));
    chips.push(chip(`${Number(timings.predicted_per_second).toFixed(1)} tok/s`, 'Decode rate'));
  }
  chips.push(chip(`${count(cached)} of ${count(usage.prompt_tokens)} prompt tokens cached`,
    'Prompt tokens the server reused from its KV cache'));
  return chips;
}
