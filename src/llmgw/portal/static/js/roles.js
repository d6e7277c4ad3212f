// What the caller may do where, from /api/me's roles, as the control plane decides it
// (core/tenancy.py): a role bound at a scope covers everything below it; a user acts as a member
// over user:NAME. The page only hides what would be refused; the control plane still decides.
export const RANK = { viewer: 1, member: 2, "team-admin": 3, "org-admin": 4, "cluster-admin": 5 };

/** The owner and every owner above it, nearest first, the cluster ("") last. */
export function lineage(owner) {
  const text = owner || "";
  if (!text) return [""];
  const [kind, path] = [text.slice(0, text.indexOf(":")), text.slice(text.indexOf(":") + 1)];
  if (kind === "user") return [text, ""];
  const parts = path.split("/");
  const chain = [];
  if (kind === "project") chain.push(text);
  if (parts.length >= 2) chain.push(`team:${parts[0]}/${parts[1]}`);
  chain.push(`org:${parts[0]}`, "");
  return chain;
}

/** The caller's highest role covering `owner` (0: none). */
export function roleOver(me, owner) {
  const above = new Set(lineage(owner));
  return Math.max(0, ...(me.roles || []).filter((r) => above.has(r.scope || "")).map((r) => RANK[r.role] || 0));
}

export function isAdminToken(me) {
  return me.name === "admin";
}

/** Whether the caller may add, change or remove what `owner` owns (models, keys). */
export function mayWrite(me, owner) {
  if (owner && owner === `user:${me.name}` && !isAdminToken(me)) return true;
  return roleOver(me, owner) >= RANK.member;
}

/** Whether the caller reads the cluster's machinery (nodes, replicas and their logs). */
export function readsCluster(me) {
  return roleOver(me, "") >= RANK.viewer;
}

/** The owners the caller may write at, from the projects, teams and orgs it sees: where a model or key may go. */
export function writablePlaces(me, units) {
  const places = [];
  if (mayWrite(me, "")) places.push("");
  if (!isAdminToken(me)) places.push(`user:${me.name}`);
  for (const owner of units) if (mayWrite(me, owner)) places.push(owner);
  return places;
}

/** Whether a key at `place` sees what `owner` owns: public things, and those owned at or above the place
 * (a user's place reaches also the orgs and teams the user holds roles at). */
export function visibleFrom(owner, place, me) {
  if (!owner) return true;
  const reach = new Set(lineage(place));
  if (place.startsWith("user:")) for (const r of me.roles || []) for (const o of lineage(r.scope)) reach.add(o);
  return reach.has(owner);
}
