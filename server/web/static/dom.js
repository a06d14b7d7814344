// DOM helpers: every element is built with createElement and every text goes in as a text node
// (textContent), so nothing the model or the user writes ever becomes live HTML.

/** An element: h('div', {class: 'x', text: 'hello', onclick: fn}, child, 'text', ...). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') el.className = value;
    else if (key === 'text') el.textContent = value;
    else if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children) {
    if (child !== undefined && child !== null && child !== false) el.append(child);
  }
  return el;
}

/** An SVG icon from path data (static strings of this file only). */
export function icon(...paths) {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('viewBox', '0 0 24 24');
  svg.setAttribute('aria-hidden', 'true');
  for (const d of paths) {
    const path = document.createElementNS(ns, 'path');
    path.setAttribute('d', d);
    svg.append(path);
  }
  return svg;
}

export const $ = (id) => document.getElementById(id);

/** "3.2 s", "850 ms". */
export function duration(ms) {
  return ms >= 1000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms)} ms`;
}

/** "12,345". */
export function count(n) {
  return Number(n).toLocaleString('en-US');
}
