// Calls beyond api.js's JSON ones: text streamed from /api (a replica's log, followed), and /v1 with
// a gateway key (sk-…) instead of the portal's token, whole or as server-sent events.
import { ApiError, authorization, session } from "./api.js";

function refused(status, data, method, path) {
  const e = (data && data.error) || {};
  const problems = e.problems || [];
  const said = [e.message || `${method} ${path} answered ${status}`, ...problems.map((p) => `${p.field}: ${p.problem}`)];
  return new ApiError(status, said.join("; "), e.hint || "", problems);
}

async function refusal(answer, method, path) {
  let data = null;
  try {
    data = JSON.parse(await answer.text());
  } catch {
    data = null;
  }
  return refused(answer.status, data, method, path);
}

function unreachable(method, path, error) {
  return new ApiError(0, `the control plane did not answer ${method} ${path} (${error.message})`,
    "check that it runs and that this address reaches it");
}

/** GET `path` of /api as text as it comes, `each(text)` per piece, until `signal` aborts or it ends. */
export async function followText(path, each, signal) {
  let answer;
  try {
    answer = await fetch(path, { headers: { ...authorization(), Accept: "text/plain" }, signal, cache: "no-store" });
  } catch (error) {
    if (signal.aborted) return;
    throw unreachable("GET", path, error);
  }
  if (!answer.ok) {
    const error = await refusal(answer, "GET", path);
    if (answer.status === 401) session.onExpired(error);
    throw error;
  }
  const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      each(value);
    }
  } catch (error) {
    if (!signal.aborted) throw error;
  }
}

/** POST `body` to /v1 `path` with the gateway key `key`; the answer's JSON. */
export async function v1(key, path, body, signal) {
  let answer;
  try {
    answer = await fetch(`/v1${path}`, {
      method: "POST",
      headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify(body),
      signal,
    });
  } catch (error) {
    throw unreachable("POST", `/v1${path}`, error);
  }
  if (!answer.ok) throw await refusal(answer, "POST", `/v1${path}`);
  return answer.json();
}

/** POST `body` (with stream: true) to /v1 `path`; `each(data)` per server-sent event's JSON, until [DONE]. */
export async function v1Stream(key, path, body, each, signal) {
  let answer;
  try {
    answer = await fetch(`/v1${path}`, {
      method: "POST",
      headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json", Accept: "text/event-stream" },
      body: JSON.stringify({ ...body, stream: true }),
      signal,
    });
  } catch (error) {
    throw unreachable("POST", `/v1${path}`, error);
  }
  if (!answer.ok) throw await refusal(answer, "POST", `/v1${path}`);
  const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer = (buffer + value).replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const parsed = JSON.parse(data);
      if (parsed.error) throw refused(500, parsed, "POST", `/v1${path}`);
      each(parsed);
    }
  }
}
