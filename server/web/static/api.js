// The server's HTTP API as the page uses it: the API key of this tab (sessionStorage), JSON GETs,
// and the streamed /v1/chat/completions and /v1/responses read from fetch's body as server-sent
// events.

const KEY = 'gpt-oss-server.api-key';

export class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export const apiKey = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

function headers(extra = {}) {
  const key = apiKey.get();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

async function errorOf(response) {
  let message = `HTTP ${response.status}`;
  let code = null;
  try {
    const body = await response.json();
    if (body && body.error) {
      message = body.error.message || message;
      code = body.error.code || null;
    }
  } catch { /* not JSON: keep the status line */ }
  return new ApiError(response.status, message, code);
}

export async function getJson(path) {
  const response = await window.fetch(path, { headers: headers() });
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

export async function getText(path) {
  const response = await window.fetch(path, { headers: headers() });
  if (!response.ok) throw await errorOf(response);
  return response.text();
}

/** The `data:` payloads of a server-sent event stream POSTed to `path`, parsed, until `[DONE]`
 * or the end of the body. */
async function* streamEvents(path, body, signal) {
  const response = await window.fetch(path, {
    method: 'POST',
    headers: headers({ 'Content-Type': 'application/json' }),
    body: JSON.stringify(body),
    signal,
  });
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    const events = buffer.split(/\r?\n\r?\n/);
    buffer = events.pop();
    for (const event of events) {
      const data = event.split(/\r?\n/).filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
      if (!data) continue;
      if (data === '[DONE]') return;
      yield JSON.parse(data);
    }
  }
}

/** The chunks of a streamed chat completion, as parsed JSON objects, until `[DONE]`. */
export async function* streamChat(body, signal) {
  for await (const chunk of streamEvents('/v1/chat/completions', body, signal)) {
    if (chunk.error) throw new ApiError(500, chunk.error.message || 'generation failed', chunk.error.code);
    yield chunk;
  }
}

/** The events of a streamed /v1/responses response (OpenAI's Responses events), until its end. */
export async function* streamResponse(body, signal) {
  for await (const event of streamEvents('/v1/responses', body, signal)) {
    if (event.type === 'error') {
      throw new ApiError(500, event.message || 'generation failed', event.code);
    }
    yield event;
  }
}
