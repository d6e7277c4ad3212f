// Live views: one stream from GET /api/events (server-sent events read with fetch(), since
// EventSource cannot send an Authorization header), or polling the GET routes where the control
// plane has no /api/events (404). Each kind's data is the whole view, as its GET route answers it.
import { api, authorization, session } from "./api.js";

export const POLL_MS = 5000;
const RETRY_MS = [1000, 2000, 5000, 10000];

/** Each kind and the GET route that answers the same shape (serving comes from /api/status). */
export const ROUTES = {
  nodes: "/api/nodes",
  replicas: "/api/replicas",
  models: "/api/models",
  settings: "/api/settings",
  keys: "/api/keys",
  status: "/api/status",
  serving: "/api/status",
};

const listeners = new Map();
const latest = new Map();
const failures = new Map();
let mode = "off";
let aborter = null;
let pollTimer = null;
let onMode = () => {};

function deliver(kind, data) {
  latest.set(kind, data);
  failures.delete(kind);
  for (const fn of listeners.get(kind) || []) fn(data, null);
}

function fail(kind, error) {
  failures.set(kind, error);
  for (const fn of listeners.get(kind) || []) fn(latest.get(kind), error);
}

/** Call fn(data, error) with each new view of `kind` (at once if one is known); returns the unsubscribe. */
export function watch(kind, fn) {
  if (!listeners.has(kind)) listeners.set(kind, new Set());
  listeners.get(kind).add(fn);
  if (latest.has(kind)) fn(latest.get(kind), null);
  else if (mode === "polling" || mode === "off") refresh(kind);
  return () => listeners.get(kind).delete(fn);
}

/** Read `kind` from its GET route now (after a change made here, or while polling). */
export async function refresh(kind) {
  try {
    const data = await api("GET", ROUTES[kind]);
    deliver(kind, kind === "serving" ? { stopped: data.stopped } : data);
  } catch (error) {
    fail(kind, error);
  }
}

function setMode(next) {
  mode = next;
  onMode(next);
}

function parseBlock(block) {
  let kind = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") kind = value;
    else if (field === "data") data.push(value);
  }
  if (!data.length || !(kind in ROUTES)) return;
  try {
    deliver(kind, JSON.parse(data.join("\n")));
  } catch (error) {
    console.warn(`llmgw portal: an /api/events '${kind}' event was not JSON`, error);
  }
}

async function stream(attempt) {
  aborter = new AbortController();
  let answer;
  try {
    answer = await fetch("/api/events", {
      headers: { ...authorization(), Accept: "text/event-stream" },
      signal: aborter.signal,
      cache: "no-store",
    });
  } catch {
    return retry(attempt);
  }
  if (answer.status === 404) return poll();
  if (answer.status === 401) {
    session.onExpired({ message: "the token was refused", hint: "sign in again" });
    return stop();
  }
  if (!answer.ok || !answer.body) return retry(attempt);
  setMode("live");
  const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer = (buffer + value).replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        parseBlock(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
      }
    }
  } catch {
    if (mode === "off") return undefined;
  }
  return retry(0);
}

function retry(attempt) {
  if (mode === "off" && aborter === null) return;
  setMode("reconnecting");
  setTimeout(() => stream(attempt + 1), RETRY_MS[Math.min(attempt, RETRY_MS.length - 1)]);
}

function poll() {
  setMode("polling");
  const round = () => {
    const routes = new Set();
    for (const [kind, fns] of listeners) if (fns.size) routes.add(kind);
    for (const kind of routes) refresh(kind);
  };
  round();
  pollTimer = setInterval(round, POLL_MS);
}

/** Start following the cluster; `modeChanged(mode)` hears "live", "polling", "reconnecting" or "off". */
export function start(modeChanged) {
  onMode = modeChanged || (() => {});
  setMode("connecting");
  stream(0);
}

export function stop() {
  if (aborter) aborter.abort();
  aborter = null;
  if (pollTimer) clearInterval(pollTimer);
  pollTimer = null;
  latest.clear();
  setMode("off");
}

/** Draw with the latest views of `kinds` (those known so far) and the errors of the last reads. */
export function follow(kinds, draw) {
  const views = {};
  const errors = {};
  const offs = kinds.map((kind) => watch(kind, (data, error) => {
    if (data !== undefined) views[kind] = data;
    if (error) errors[kind] = error;
    else delete errors[kind];
    draw(views, Object.values(errors));
  }));
  return () => offs.forEach((off) => off());
}

/** Call fn now and every `ms` until the returned stop is called (for what /api/events does not carry). */
export function every(ms, fn) {
  fn();
  const timer = setInterval(fn, ms);
  return () => clearInterval(timer);
}
