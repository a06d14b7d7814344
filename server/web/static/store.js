// Conversations kept in this browser (localStorage): a list of plain objects, saved whole.
//   {id, title, created, updated, settings: {instructions, effort, temperature, tools},
//    messages: [{role: 'user', content} | {role: 'assistant', content, reasoning, stats,
//                state: 'done' | 'stopped' | 'error', error, trace}]}
//   (`trace`, for a turn sent with server-run tools: its reasoning and tool calls in order)

import { settleCalls } from './tools.js';

const KEY = 'gpt-oss-server.conversations.v1';
const CURRENT = 'gpt-oss-server.current';

export class Store {
  constructor() {
    this.conversations = load();
  }

  get(id) {
    return this.conversations.find((c) => c.id === id) || null;
  }

  create(settings) {
    const now = Date.now();
    const conversation = {
      id: `c${now.toString(36)}${Math.random().toString(36).slice(2, 8)}`,
      title: 'New chat',
      created: now,
      updated: now,
      settings: { ...settings },
      messages: [],
    };
    this.conversations.unshift(conversation);
    return conversation;
  }

  /** Saves everything; `touched` moves to the top of the list. */
  save(touched) {
    if (touched) {
      touched.updated = Date.now();
      this.conversations = [touched, ...this.conversations.filter((c) => c !== touched)];
    }
    try {
      localStorage.setItem(KEY, JSON.stringify(this.conversations.filter((c) => c.messages.length)));
    } catch (error) {
      console.warn('could not save the conversations', error);
    }
  }

  remove(id) {
    this.conversations = this.conversations.filter((c) => c.id !== id);
    this.save();
  }

  get currentId() {
    return localStorage.getItem(CURRENT);
  }

  set currentId(id) {
    localStorage.setItem(CURRENT, id);
  }
}

function load() {
  try {
    const list = JSON.parse(localStorage.getItem(KEY) || '[]');
    if (!Array.isArray(list)) return [];
    const conversations = list.filter((c) => c && c.id && Array.isArray(c.messages));
    for (const message of conversations.flatMap((c) => c.messages)) {
      // A page closed mid-stream left its answer unfinished.
      if (['waiting', 'thinking', 'answering'].includes(message.state)) {
        message.state = 'stopped';
        settleCalls(message);
      }
    }
    return conversations;
  } catch {
    return [];
  }
}

/** A conversation as a JSON file download. */
export function exportConversation(conversation) {
  const payload = {
    format: 'gpt-oss-server.conversation',
    version: 1,
    exported_at: new Date().toISOString(),
    conversation,
  };
  const blob = new Blob([JSON.stringify(payload, null, 2)], { type: 'application/json' });
  const url = URL.createObjectURL(blob);
  const a = document.createElement('a');
  a.href = url;
  a.download = `${conversation.title.replace(/[^\w.-]+/g, '-').slice(0, 60) || 'conversation'}.json`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
