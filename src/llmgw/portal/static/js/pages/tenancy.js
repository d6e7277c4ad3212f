// Organisations, teams and projects as a tree, with the forms that create them and grant roles.
// Forms are drawn only for callers whose role allows them (from /api/me): a cluster admin creates
// organisations, an org admin teams, a team admin projects; what is listed is what /api lets the caller see.
import { api, get } from "../api.js";
import { h, problem, section, table, when } from "../dom.js";

const RANK = { viewer: 0, member: 1, "team-admin": 2, "org-admin": 3, "cluster-admin": 4 };

/** Whether `me` holds at least `role` at `scope` ("" the cluster, "org:A", "team:A/T") or above it. */
export function holds(me, role, scope) {
  const above = [""];
  if (scope.startsWith("org:")) above.push(scope);
  if (scope.startsWith("team:")) above.push(`org:${scope.slice(5).split("/")[0]}`, scope);
  return (me?.roles || []).some((r) => above.includes(r.scope) && RANK[r.role] >= RANK[role]);
}

function form(id, fields, button, send) {
  const said = h("div", { class: "said" });
  const inputs = fields.map((f) => h("input", { id: `${id}-${f.name}`, name: f.name, required: f.required !== false, placeholder: f.placeholder || f.name }));
  const el = h("form", { class: "inline-form", id, onsubmit: async (event) => {
    event.preventDefault();
    try {
      await send(Object.fromEntries(inputs.map((i) => [i.name, i.value.trim()])));
      for (const i of inputs) i.value = "";
      said.replaceChildren();
    } catch (error) {
      said.replaceChildren(problem(error));
    }
  } }, fields.map((f, n) => [h("label", { for: `${id}-${f.name}` }, f.label), inputs[n]]),
  h("button", { type: "submit", class: "primary" }, button), said);
  return el;
}

export function tenancyPage(main, _params, { me }) {
  const tree = h("div", { id: "tenancy-tree" });
  const users = h("div", { id: "tenancy-users" });
  const said = h("div");
  const forms = h("div");
  const limits = h("div", { id: "tenancy-limits" });
  main.append(h("h1", {}, "Organisations, teams and projects"), said, section("Tree", tree), forms, section("Users and roles", users), section("Limits", limits));

  const admin = (me?.roles || []).some((r) => RANK[r.role] >= RANK["team-admin"]);

  async function load() {
    try {
      const [orgs, teams, projects] = await Promise.all([get("/api/orgs"), get("/api/teams"), get("/api/projects")]);
      const under = (list, path) => list.filter((u) => u.path.startsWith(`${path}/`) && u.path.split("/").length === path.split("/").length + 1);
      const item = (unit, kind, children) => h("li", { "data-owner": unit.owner, class: kind },
        h("span", { class: "unit" }, `${kind} ${unit.path.split("/").pop()}`), h("span", { class: "hint" }, ` created ${when(unit.created_at)}`),
        children && children.length ? h("ul", {}, children) : null);
      tree.replaceChildren(orgs.length || teams.length || projects.length
        ? h("ul", { class: "tree" }, orgs.map((o) => item(o, "org", under(teams, o.path).map((t) => item(t, "team", under(projects, t.path).map((p) => item(p, "project")))))),
          teams.filter((t) => !orgs.some((o) => t.path.startsWith(`${o.path}/`))).map((t) => item(t, "team", under(projects, t.path).map((p) => item(p, "project")))),
          projects.filter((p) => !teams.some((t) => p.path.startsWith(`${t.path}/`))).map((p) => item(p, "project")))
        : h("p", { class: "empty" }, "no organisations you can see"));
      if (admin) {
        const people = await get("/api/users");
        users.replaceChildren(table([
          { title: "User", value: (u) => u.name },
          { title: "Roles", value: (u) => u.roles.map((r) => `${r.role} ${r.scope || "cluster"}`).join(", ") || "–" },
          { title: "", value: (u) => u.roles.map((r) => h("button", { type: "button", class: "link danger", "data-revoke": `${u.name} ${r.scope}`, onclick: async () => {
            try {
              await api("DELETE", `/api/users/${encodeURIComponent(u.name)}/roles?scope=${encodeURIComponent(r.scope)}`);
              await load();
            } catch (error) {
              said.replaceChildren(problem(error));
            }
          } }, `Revoke ${r.role} ${r.scope || "cluster"}`)) },
        ], people, "no users"));
      } else {
        users.replaceChildren(table([{ title: "Role", value: (r) => r.role }, { title: "Scope", value: (r) => r.scope || "cluster" }], me?.roles || [], "no roles"));
      }
      const set = await get("/api/limits");
      limits.replaceChildren(table(LIMIT_COLUMNS, set, "no limits set on what you can see"));
    } catch (error) {
      said.replaceChildren(problem(error));
    }
  }

  const then = (send) => async (values) => { await send(values); await load(); };
  if (holds(me, "cluster-admin", "")) {
    forms.append(section("Create an organisation", form("create-org", [{ name: "name", label: "Name" }], "Create organisation",
      then((v) => api("POST", "/api/orgs", v)))));
  }
  if ((me?.roles || []).some((r) => RANK[r.role] >= RANK["org-admin"])) {
    forms.append(section("Create a team", form("create-team", [{ name: "org", label: "Organisation" }, { name: "name", label: "Name" }], "Create team",
      then((v) => api("POST", "/api/teams", v)))));
  }
  if (admin) {
    forms.append(section("Create a project", form("create-project",
      [{ name: "org", label: "Organisation" }, { name: "team", label: "Team" }, { name: "name", label: "Name" }], "Create project",
      then((v) => api("POST", "/api/projects", v)))));
    forms.append(section("Grant a role", form("grant-role",
      [{ name: "user", label: "User" }, { name: "role", label: "Role", placeholder: "member, team-admin, org-admin…" }, { name: "scope", label: "Scope", placeholder: "team:ORG/TEAM or org:ORG", required: false }],
      "Grant", then((v) => api("PUT", `/api/users/${encodeURIComponent(v.user)}/roles`, { role: v.role, scope: v.scope })))));
  }
  if (admin) {
    forms.append(section("Set limits", form("set-limits",
      [{ name: "subject", label: "Subject", placeholder: "project:ORG/TEAM/PROJECT, team:ORG/TEAM, key:ID" },
        ...LIMIT_FIELDS.map((f) => ({ name: f.name, label: f.label, required: false, placeholder: f.hint }))],
      "Set (replaces the subject's limits)", then((v) => api("PUT", `/api/limits/${encodeURIComponent(v.subject)}`, limitsBody(v))))));
  }
  load();
  return () => {};
}

/** The limits a subject may have that the form sets (a field left empty: no limit on that). */
const LIMIT_FIELDS = [
  { name: "requests_per_minute", label: "Requests / min", hint: "none" },
  { name: "tokens_per_minute", label: "Tokens / min", hint: "none" },
  { name: "concurrent", label: "At once", hint: "none" },
  { name: "tokens_per_day", label: "Tokens / day", hint: "none" },
  { name: "usd_per_day", label: "Money / day", hint: "none" },
  { name: "usd_per_month", label: "Money / month", hint: "none" },
  { name: "priority", label: "Queue priority", hint: "0 (sheddable) to 9; 5 when none" },
];

const LIMIT_COLUMNS = [
  { title: "Subject", value: (l) => l.subject },
  ...LIMIT_FIELDS.map((f) => ({ title: f.label, value: (l) => (l[f.name] === null || l[f.name] === undefined ? "–" : String(l[f.name])), class: "num" })),
];

/** The form's values as /api/limits takes them: numbers, the empty ones left out. */
export function limitsBody(values) {
  const body = {};
  for (const f of LIMIT_FIELDS) {
    if (values[f.name] === "") continue;
    const n = Number(values[f.name]);
    body[f.name] = Number.isFinite(n) ? n : values[f.name]; // not a number: the control plane names it
  }
  return body;
}
