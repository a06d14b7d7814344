// A small Markdown renderer that builds DOM nodes: headings, paragraphs, lists, block quotes,
// fenced code, tables, rules; inline code, bold, italic, strikethrough and http(s) links.
// Text only ever enters the page as text nodes, so model output never becomes live HTML: a
// `<script>` in an answer is shown as the characters `<script>`. Unfinished input (a stream
// cut mid-fence) renders as far as it goes.

import { h } from './dom.js';

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(\s+#+)?\s*$/;
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_RULE = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
const SAFE_URL = /^(https?:\/\/|mailto:)[^\s<>"']+$/i;

/** The Markdown `text` as a DocumentFragment. */
export function renderMarkdown(text) {
  const fragment = document.createDocumentFragment();
  fragment.append(...blocks(text.replace(/\r\n?/g, '\n').split('\n')));
  return fragment;
}

function blocks(lines) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) { i += 1; continue; }
    const block = fence(lines, i) || heading(lines, i) || rule(lines, i) || quote(lines, i)
      || list(lines, i) || table(lines, i) || paragraph(lines, i);
    out.push(block.node);
    i = block.next;
  }
  return out;
}

function fence(lines, i) {
  const open = FENCE.exec(lines[i]);
  if (!open) return null;
  const marker = open[1];
  const body = [];
  let j = i + 1;
  while (j < lines.length && !isClosingFence(lines[j], marker)) body.push(lines[j++]);
  return { node: codeBlock(body.join('\n'), open[2]), next: j + 1 };
}

function isClosingFence(line, marker) {
  const trimmed = line.trim();
  return trimmed.length >= marker.length && trimmed[0] === marker[0]
    && [...trimmed].every((c) => c === marker[0]);
}

function codeBlock(code, language) {
  const lang = (language || '').replace(/[^\w+#.-]/g, '').slice(0, 24);
  const codeEl = h('code', { class: lang ? `language-${lang}` : null, text: code });
  const copy = h('button', { type: 'button', class: 'copy', text: 'Copy' });
  copy.addEventListener('click', () => copyText(code, copy));
  return h('div', { class: 'code-block' },
    h('div', { class: 'code-head' }, h('span', { text: lang || 'text' }), copy),
    h('pre', {}, codeEl));
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = 'Copied';
  } catch {
    button.textContent = 'Copy failed';
  }
  setTimeout(() => { button.textContent = 'Copy'; }, 1500);
}

function heading(lines, i) {
  const m = HEADING.exec(lines[i]);
  if (!m) return null;
  return { node: h(`h${Math.min(m[1].length + 1, 6)}`, {}, ...inline(m[2])), next: i + 1 };
}

function rule(lines, i) {
  return RULE.test(lines[i]) ? { node: h('hr'), next: i + 1 } : null;
}

function quote(lines, i) {
  if (!QUOTE.test(lines[i])) return null;
  const body = [];
  let j = i;
  while (j < lines.length && QUOTE.test(lines[j])) body.push(QUOTE.exec(lines[j++])[1]);
  return { node: h('blockquote', {}, ...blocks(body)), next: j };
}

function list(lines, i) {
  const first = ITEM.exec(lines[i]);
  if (!first) return null;
  const ordered = /\d/.test(first[2]);
  const items = [];
  let j = i;
  let loose = false;
  while (j < lines.length) {
    const m = ITEM.exec(lines[j]);
    if (!m || /\d/.test(m[2]) !== ordered) break;
    const indent = m[1].length + m[2].length + 1;
    const body = [m[3]];
    j += 1;
    while (j < lines.length) {
      const line = lines[j];
      if (!line.trim()) {
        const next = lines[j + 1];
        if (next !== undefined && /^\s{2,}\S/.test(next)) { body.push(''); loose = true; j += 1; continue; }
        break;
      }
      if (/^\s{2,}/.test(line)) { body.push(line.slice(Math.min(indent, line.search(/\S/)))); j += 1; continue; }
      if (ITEM.exec(line) || startsBlock(line)) break;
      body.push(line.trim());
      j += 1;
    }
    items.push(body);
    if (j < lines.length && !lines[j].trim() && ITEM.exec(lines[j + 1] || '')) { loose = true; j += 1; }
  }
  const start = ordered ? parseInt(first[2], 10) : null;
  const node = h(ordered ? 'ol' : 'ul', { start: start !== null && start !== 1 ? start : null },
    ...items.map((body) => h('li', {}, ...itemContent(body, loose))));
  return { node, next: j };
}

function itemContent(body, loose) {
  const children = blocks(body);
  if (!loose && children.length && children[0].tagName === 'P') {
    return [...children[0].childNodes, ...children.slice(1)];
  }
  return children;
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line);
}

function table(lines, i) {
  if (!lines[i].includes('|') || i + 1 >= lines.length || !TABLE_RULE.test(lines[i + 1])) {
    return null;
  }
  const align = cells(lines[i + 1]).map((c) => {
    const left = c.startsWith(':');
    const right = c.endsWith(':');
    if (left && right) return 'center';
    return right ? 'right' : left ? 'left' : null;
  });
  const row = (line, tag) => h('tr', {}, ...cells(line).map(
    (cell, k) => h(tag, { class: align[k] ? `align-${align[k]}` : null }, ...inline(cell)),
  ));
  const body = [];
  let j = i + 2;
  while (j < lines.length && lines[j].trim() && lines[j].includes('|')) body.push(row(lines[j++], 'td'));
  const node = h('div', { class: 'table-wrap' },
    h('table', {}, h('thead', {}, row(lines[i], 'th')), h('tbody', {}, ...body)));
  return { node, next: j };
}

function cells(line) {
  let s = line.trim();
  if (s.startsWith('|')) s = s.slice(1);
  if (s.endsWith('|') && !s.endsWith('\\|')) s = s.slice(0, -1);
  return s.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, '|'));
}

function paragraph(lines, i) {
  const body = [lines[i]];
  let j = i + 1;
  while (j < lines.length && lines[j].trim() && !startsBlock(lines[j]) && !ITEM.test(lines[j])
    && !(lines[j].includes('|') && TABLE_RULE.test(lines[j + 1] || ''))) {
    body.push(lines[j++]);
  }
  const nodes = [];
  body.forEach((line, k) => {
    if (k) nodes.push(h('br'));
    nodes.push(...inline(line.trim()));
  });
  return { node: h('p', {}, ...nodes), next: j };
}

// Inline spans ------------------------------------------------------------------------------

const EMPHASIS = [
  ['**', 'strong'], ['__', 'strong'], ['~~', 'del'], ['*', 'em'], ['_', 'em'],
];

/** Inline Markdown as a list of nodes (text nodes and the few elements above). */
export function inline(text) {
  const out = [];
  let plain = '';
  const flush = () => { if (plain) { out.push(document.createTextNode(plain)); plain = ''; } };
  let i = 0;
  while (i < text.length) {
    const span = codeSpan(text, i) || link(text, i) || autolink(text, i) || emphasis(text, i);
    if (span) {
      flush();
      out.push(span.node);
      i = span.next;
    } else if (text[i] === '\\' && /[\\`*_{}[\]()#+\-.!|~<>]/.test(text[i + 1] || '')) {
      plain += text[i + 1];
      i += 2;
    } else {
      plain += text[i];
      i += 1;
    }
  }
  flush();
  return out;
}

function codeSpan(text, i) {
  if (text[i] !== '`') return null;
  let n = 0;
  while (text[i + n] === '`') n += 1;
  const fenceMark = '`'.repeat(n);
  const end = text.indexOf(fenceMark, i + n);
  if (end < 0) return null;
  return { node: h('code', { text: text.slice(i + n, end).trim() || text.slice(i + n, end) }), next: end + n };
}

function link(text, i) {
  if (text[i] !== '[') return null;
  const close = text.indexOf('](', i + 1);
  if (close < 0 || text.slice(i + 1, close).includes('\n')) return null;
  const end = text.indexOf(')', close + 2);
  if (end < 0) return null;
  const url = text.slice(close + 2, end).trim().split(/\s+/)[0];
  const label = text.slice(i + 1, close);
  if (!SAFE_URL.test(url)) return null;  // javascript:, data: and the like stay plain text
  return { node: anchor(url, inline(label)), next: end + 1 };
}

function autolink(text, i) {
  if (!/^https?:\/\//i.test(text.slice(i, i + 8)) || (i > 0 && /\w/.test(text[i - 1]))) return null;
  const m = /^https?:\/\/[^\s<>"'`]+/i.exec(text.slice(i));
  if (!m) return null;
  const url = m[0].replace(/[.,;:!?)\]]+$/, '');
  if (!SAFE_URL.test(url)) return null;
  return { node: anchor(url, [document.createTextNode(url)]), next: i + url.length };
}

function anchor(url, children) {
  return h('a', { href: url, target: '_blank', rel: 'noopener noreferrer nofollow' }, ...children);
}

function emphasis(text, i) {
  for (const [mark, tag] of EMPHASIS) {
    if (!text.startsWith(mark, i)) continue;
    const after = text[i + mark.length];
    if (!after || /\s/.test(after)) continue;
    if (mark[0] === '_' && i > 0 && /\w/.test(text[i - 1])) continue;
    let end = text.indexOf(mark, i + mark.length + 1);
    while (end > 0 && (/\s/.test(text[end - 1]) || (mark === '*' && text[end + 1] === '*'))) {
      end = text.indexOf(mark, end + (text[end + 1] === '*' ? 2 : 1));
    }
    if (end < 0) continue;
    if (mark[0] === '_' && /\w/.test(text[end + mark.length] || '')) continue;
    return { node: h(tag, {}, ...inline(text.slice(i + mark.length, end))), next: end + mark.length };
  }
  return null;
}
