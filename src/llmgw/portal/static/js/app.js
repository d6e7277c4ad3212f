// The portal's frame: signing in, the navigation, and which page the address (#/...) shows.
import { ApiError, get, session, signOutOfProvider } from "./api.js";
import { h, problem } from "./dom.js";
import * as live from "./live.js";
import { batchesPage } from "./pages/batches.js";
import { clusterPage } from "./pages/cluster.js";
import { gpuMapPage } from "./pages/gpumap.js";
import { keysPage } from "./pages/keys.js";
import { modelsPage } from "./pages/models.js";
import { nodePage, nodesPage } from "./pages/nodes.js";
import { playgroundPage } from "./pages/playground.js";
import { settingsPage } from "./pages/settings.js";
import { tenancyPage } from "./pages/tenancy.js";

const PAGES = [
  { path: "cluster", title: "Cluster", render: clusterPage },
  { path: "nodes", title: "Nodes", render: nodesPage },
  { path: "gpus", title: "GPU map", render: gpuMapPage },
  { path: "models", title: "Models", render: modelsPage },
  { path: "playground", title: "Playground", render: playgroundPage },
  { path: "keys", title: "Keys & usage", render: keysPage },
  { path: "tenancy", title: "Tenancy", render: tenancyPage },
  { path: "batches", title: "Batches", render: batchesPage },
  { path: "settings", title: "Settings", render: settingsPage },
];

const root = document.getElementById("app");
let leave = () => {};
let me = null;

function route() {
  const [path, ...rest] = (location.hash.replace(/^#\/?/, "") || "cluster").split("/");
  if (path === "nodes" && rest.length) return { page: { path, title: "Node", render: nodePage }, params: rest.map(decodeURIComponent) };
  return { page: PAGES.find((p) => p.path === path) || PAGES[0], params: rest };
}

function signIn(reason) {
  leave();
  leave = () => {};
  live.stop();
  const input = h("input", { type: "password", name: "token", id: "token", autocomplete: "current-password", required: true, placeholder: "admin token or user token" });
  const said = h("div", { class: "said" }, reason ? problem(reason) : null);
  const form = h("form", { class: "signin panel", onsubmit: async (event) => {
    event.preventDefault();
    session.keep(input.value.trim());
    try {
      me = await get("/api/me");
      start();
    } catch (error) {
      session.forget();
      said.replaceChildren(problem(error));
    }
  } },
  h("h1", {}, "llmgw"),
  h("label", { for: "token" }, "Token"),
  input,
  h("p", { class: "hint" }, "The admin token is in admin.token beside server.yaml; a user's comes from 'llmgw ctl user token create USER'. It is kept in this tab only."),
  h("button", { type: "submit", class: "primary" }, "Sign in"),
  said);
  root.replaceChildren(h("main", { class: "center" }, form));
  input.focus();
  offerProvider(form);
}

async function offerProvider(form) {
  let provider = null;
  try {
    const answer = await fetch("/auth/provider", { headers: { Accept: "application/json" } });
    provider = answer.ok ? await answer.json() : null;
  } catch {
    provider = null;
  }
  if (!provider || !provider.configured) return;
  form.prepend(h("a", { class: "button primary", id: "signin-provider", href: "/auth/login" }, `Sign in with ${provider.name}`),
    h("p", { class: "hint" }, "Or, as the break-glass way in, with a token:"));
  form.querySelector("h1")?.remove();
  form.prepend(h("h1", {}, "llmgw"));
}

function frame() {
  const state = h("span", { class: "live", id: "live-state" }, "connecting");
  const nav = h("nav", { id: "nav" }, PAGES.map((p) => h("a", { href: `#/${p.path}`, "data-page": p.path }, p.title)));
  const toggle = h("button", { class: "menu", type: "button", "aria-controls": "nav", "aria-label": "menu", onclick: () => nav.classList.toggle("open") }, "☰");
  const header = h("header", {},
    toggle,
    h("a", { class: "brand", href: "#/cluster" }, "llmgw"),
    state,
    h("span", { class: "who" }, me ? me.name : ""),
    h("button", { type: "button", class: "link", onclick: async () => { session.forget(); await signOutOfProvider(); me = null; signIn(null); } }, "Sign out"));
  const main = h("main", { id: "page" });
  root.replaceChildren(header, h("div", { class: "body" }, nav, main));
  return { main, nav, state };
}

function start() {
  const { main, nav, state } = frame();
  live.start((mode) => {
    state.textContent = mode === "polling" ? "updates every 5 s" : mode;
    state.dataset.mode = mode;
  });
  const show = () => {
    leave();
    const { page, params } = route();
    for (const a of nav.querySelectorAll("a")) a.classList.toggle("current", a.dataset.page === page.path);
    nav.classList.remove("open");
    document.title = `${page.title} · llmgw`;
    main.replaceChildren();
    try {
      leave = page.render(main, params, { me }) || (() => {});
    } catch (error) {
      console.error(error);
      main.replaceChildren(problem({ message: `the ${page.title} page failed to draw: ${error.message}`, hint: "reload the page; if it persists, report it with the browser console's output" }));
      leave = () => {};
    }
  };
  window.onhashchange = show;
  show();
}

session.onExpired = (error) => {
  if (me === null) return;
  me = null;
  signIn(new ApiError(401, "the token was refused: it is wrong, expired or revoked", error.hint || "sign in again with a live token"));
};

async function boot() {
  if (!session.token() && !session.csrf()) return signIn(null);
  try {
    me = await get("/api/me");
    start();
  } catch (error) {
    session.forget();
    signIn(error);
  }
}

boot();
