// A real OpenID Connect provider for the dashboard's sign-on tests: node-oidc-provider
// (npm `oidc-provider`, 9.x) with one confidential client and four people whose
// `groups` claim the dashboard maps to a role. Its development login page takes any
// password for a known login; the consent page has one button.
//
//   node oidc_provider.mjs   (env: OIDC_PROVIDER_DIR, OIDC_HOST, OIDC_PORT, OIDC_CLIENT_ID,
//                             OIDC_CLIENT_SECRET, OIDC_REDIRECT_URIS as a JSON list)
//
// It listens on 127.0.0.1 (OIDC_PORT, default a free port), names itself
// http://OIDC_HOST:PORT, and prints one JSON line, {"issuer": ...}, once it answers;
// SIGTERM stops it. docs/sign-on.md runs it by hand for a trial.

import { generateKeyPairSync } from 'node:crypto';
import { createServer } from 'node:http';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const env = process.env;
const { default: Provider } = await import(
  pathToFileURL(join(env.OIDC_PROVIDER_DIR, 'lib', 'index.js')).href
);

// Each person's claims; `sub` is the login typed on the provider's page.
const PEOPLE = {
  alice: { preferred_username: 'alice', email: 'alice@example.test', groups: ['phasegate-approvers', 'staff'] },
  vera: { preferred_username: 'vera', email: 'vera@example.test', groups: ['staff'] },
  ada: { preferred_username: 'ada', email: 'ada@example.test', groups: ['phasegate-admins'] },
  otto: { preferred_username: 'otto', email: 'otto@example.test', groups: ['contractors'] },
};

// A signing key of its own each start: the dashboard must read it from the JWKS.
const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const signing = { ...privateKey.export({ format: 'jwk' }), kid: `test-${Date.now()}`, use: 'sig', alg: 'RS256' };

const server = createServer();
server.listen(Number(env.OIDC_PORT || 0), '127.0.0.1', () => {
  const issuer = `http://${env.OIDC_HOST || '127.0.0.1'}:${server.address().port}`;
  const provider = new Provider(issuer, {
    clients: [{
      client_id: env.OIDC_CLIENT_ID,
      client_secret: env.OIDC_CLIENT_SECRET,
      redirect_uris: JSON.parse(env.OIDC_REDIRECT_URIS),
      grant_types: ['authorization_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_basic',
    }],
    jwks: { keys: [signing] },
    scopes: ['openid', 'profile', 'email', 'groups'],
    claims: {
      openid: ['sub'],
      profile: ['preferred_username'],
      email: ['email'],
      groups: ['groups'],
    },
    features: { devInteractions: { enabled: true } },
    async findAccount(ctx, sub) {
      const person = PEOPLE[sub];
      if (!person) return undefined;
      return { accountId: sub, async claims() { return { sub, ...person }; } };
    },
    // Cookies signed, as a deployment would have them.
    cookies: { keys: ['test-cookie-key-0123456789abcdef'] },
  });
  // Plain http on loopback: no proxy in front, and no `secure` cookies over it.
  server.on('request', provider.callback());
  process.stdout.write(`${JSON.stringify({ issuer })}\n`);
});

process.on('SIGTERM', () => server.close(() => process.exit(0)));
