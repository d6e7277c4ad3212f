// /api with the token the user signed in with (kept in sessionStorage, sent as a bearer token), or,
// signed in with the organisation's provider, with the session cookie (HttpOnly: the browser sends it)
// and the session's CSRF token (the llmgw_csrf cookie) as X-CSRF-Token.
const TOKEN = "llmgw.token";

function cookie(name) {
  const found = document.cookie.split("; ").find((c) => c.startsWith(`${name}=`));
  return found ? decodeURIComponent(found.slice(name.length + 1)) : "";
}

export const session = {
  token: () => sessionStorage.getItem(TOKEN) || "",
  csrf: () => cookie("llmgw_csrf"),
  keep: (token) => sessionStorage.setItem(TOKEN, token),
  forget: () => sessionStorage.removeItem(TOKEN),
  onExpired: () => {},
};

/** End the provider session of this browser, if any (the cookies go; its token is revoked). */
export async function signOutOfProvider() {
  if (!session.csrf()) return;
  try {
    await fetch("/auth/logout", { method: "POST", headers: { "X-CSRF-Token": session.csrf() } });
  } catch {
    // the cookies stay until they expire; the next sign-in replaces them
  }
}

/** What /api answered when it refused: its message and hint, as every /api error carries. */
export class ApiError extends Error {
  constructor(status, message, hint, problems) {
    super(message);
    this.status = status;
    this.hint = hint || "";
    this.problems = problems || [];
  }
}

export function authorization() {
  if (session.token()) return { Authorization: `Bearer ${session.token()}` };
  return session.csrf() ? { "X-CSRF-Token": session.csrf() } : {};
}

export async function api(method, path, body) {
  const headers = { ...authorization(), Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let answer;
  try {
    answer = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (error) {
    throw new ApiError(0, `the control plane did not answer ${method} ${path} (${error.message})`,
      "check that it runs and that this address reaches it; the page tries again on its next update");
  }
  if (answer.status === 204) return null;
  const text = await answer.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!answer.ok) {
    const e = (data && data.error) || {};
    const problems = (e.problems || []).map((p) => `${p.field}: ${p.problem}`);
    const message = [e.message || `${method} ${path} answered ${answer.status}`, ...problems].join("; ");
    const error = new ApiError(answer.status, message, e.hint, e.problems);
    if (answer.status === 401) session.onExpired(error);
    throw error;
  }
  return data;
}

export const get = (path) => api("GET", path);
