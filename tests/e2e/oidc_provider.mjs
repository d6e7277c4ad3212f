// A real OpenID Connect provider for the end-to-end tests: panva's oidc-provider (OpenID Certified),
// with its development sign-in pages. The users and their groups are read from USERS_FILE (JSON,
// {"name": ["group", ...]}) at every sign-in, so a test changes a user's groups by rewriting it.
// Environment: OIDC_PROVIDER_MODULE (the package's lib/index.js), PORT, CLIENT_ID, CLIENT_SECRET,
// REDIRECT_URI, USERS_FILE. Prints "listening <issuer>" once it serves.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const { default: Provider } = await import(pathToFileURL(process.env.OIDC_PROVIDER_MODULE).href);
const port = Number(process.env.PORT);
const issuer = `http://127.0.0.1:${port}`;

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: process.env.CLIENT_ID,
      client_secret: process.env.CLIENT_SECRET,
      redirect_uris: [process.env.REDIRECT_URI],
      grant_types: ["authorization_code"],
      response_types: ["code"],
    },
  ],
  claims: { openid: ["sub"], profile: ["preferred_username", "groups"] },
  conformIdTokenClaims: false,
  pkce: { required: () => true },
  async findAccount(ctx, id) {
    const users = JSON.parse(readFileSync(process.env.USERS_FILE, "utf8"));
    if (!(id in users)) return undefined;
    return {
      accountId: id,
      async claims() {
        const now = JSON.parse(readFileSync(process.env.USERS_FILE, "utf8"));
        return { sub: id, preferred_username: id, groups: now[id] || [] };
      },
    };
  },
});

provider.listen(port, "127.0.0.1", () => console.log(`listening ${issuer}`));
