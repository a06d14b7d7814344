// The "server" view: facts from /v1/server and live load from /metrics (Prometheus text),
// refreshed every few seconds while the view is open; the status dot in the top bar.

import { $, count, h } from './dom.js';
import { getJson, getText } from './api.js';

const REFRESH_MS = 3000;

/** Prometheus text exposition -> Map of `name{labels}` (labels as written) -> number. */
export function parseMetrics(text) {
  const values = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?)\s+(\S+)/.exec(line);
    if (m) values.set(m[1], Number(m[2]));
  }
  return values;
}

function rate(metrics, tokens, phase) {
  const n = metrics.get(`gpt_oss_tokens_total{kind="${tokens}"}`);
  const s = metrics.get(`gpt_oss_engine_seconds_total{phase="${phase}"}`);
  return n && s ? n / s : null;
}

function requests(metrics) {
  let total = 0;
  for (const [name, value] of metrics) {
    if (name.startsWith('gpt_oss_requests_total{') && /endpoint="\/v1\/(chat|responses)/.test(name)) {
      total += value;
    }
  }
  return total;
}

export class ServerView {
  constructor(onUnauthorized) {
    this.onUnauthorized = onUnauthorized;
    this.facts = null;
    this.timer = null;
    this.previous = null;
  }

  async loadFacts() {
    this.facts = await getJson('/v1/server');
    return this.facts;
  }

  open() {
    $('server-panel').hidden = false;
    this.refresh();
    this.timer = setInterval(() => this.refresh(), REFRESH_MS);
  }

  close() {
    $('server-panel').hidden = true;
    clearInterval(this.timer);
    this.timer = null;
  }

  setStatus(status) {
    $('status-dot').dataset.status = status;
  }

  async refresh() {
    try {
      const [facts, text] = await Promise.all([this.loadFacts(), getText('/metrics')]);
      this.render(facts, parseMetrics(text));
      this.setStatus('ok');
    } catch (error) {
      this.setStatus(error.status === 401 ? 'locked' : 'down');
      if (error.status === 401) this.onUnauthorized();
      $('server-updated').textContent = `Unreachable: ${error.message}`;
    }
  }

  render(facts, metrics) {
    const get = (name) => metrics.get(name);
    const prefill = rate(metrics, 'evaluated', 'prefill');
    const decode = rate(metrics, 'generated', 'decode');
    const rows = [
      ['Model', facts.model, facts.description],
      ['Context', `${count(facts.n_ctx)} tokens`, `trained for ${count(facts.n_ctx_train)}`],
      ['Placement', facts.placement || 'not reported'],
      ['Slots in use', `${get('gpt_oss_active_sequences') ?? '–'} of ${facts.slots}`],
      ['Queue', `${get('gpt_oss_queue_depth') ?? '–'} waiting`, `room for ${facts.max_waiting}`],
      ['Prefill', prefill ? `${prefill.toFixed(1)} tok/s` : '–', 'mean over all requests'],
      ['Decode', decode ? `${decode.toFixed(1)} tok/s` : '–', 'per sequence, mean'],
      ['Tokens', `${count(get('gpt_oss_tokens_total{kind="generated"}') || 0)} generated`,
        `${count(get('gpt_oss_tokens_total{kind="cached"}') || 0)} prompt tokens from cache`],
      ['Requests', count(requests(metrics))],
      ['Reasoning shown', facts.reasoning_visibility],
      ['Version', facts.version],
    ];
    const list = $('server-facts');
    list.replaceChildren(...rows.flatMap(([label, value, note]) => [
      h('dt', { text: label }),
      h('dd', { 'data-fact': label.toLowerCase().replace(/\s+/g, '-') },
        h('span', { text: String(value) }), note ? h('small', { text: note }) : null),
    ]));
    $('server-updated').textContent = `Updated ${new Date().toLocaleTimeString()}`;
  }
}
