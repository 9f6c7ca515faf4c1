// The OpenID provider that tests/sso/ start: panva's oidc-provider (OpenID Certified) with one
// client, a login page of its own, and a groups claim.
//
//   node provider.mjs    with PORT, CLIENT_ID, CLIENT_SECRET, REDIRECT_URI, STATE_FILE and
//                        POST_LOGOUT_REDIRECT_URIS (space-separated) set
//
// STATE_FILE is JSON that the provider reads again at every request, so a test changes a user's
// groups between two logins (or breaks the next ID token) by rewriting it:
//   {"users": {"dana": {"password": "...", "groups": ["gpu-vision-leads"], "email": "..."}},
//    "id_token": "genuine" | "expired" | "tampered" | "wrong-issuer", "down_after_code": false}
// The last two are test-only switches. "id_token": the token endpoint's ID token is re-signed
// with its exp in the past, or with another issuer, or has its payload changed under the
// original signature. "down_after_code": the provider stops listening as it sends the browser
// back to the portal with a code, and exits: the portal finds it down when it asks for tokens.
import { readFileSync } from 'node:fs';

import * as jose from 'jose';
import Provider from 'oidc-provider';

const PORT = Number(process.env.PORT);
const ISSUER = process.env.ISSUER || `http://127.0.0.1:${PORT}`;
const IMPOSTOR_ISSUER = 'http://impostor.invalid';

function state() {
  return JSON.parse(readFileSync(process.env.STATE_FILE, 'utf8'));
}

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

const { privateKey } = await jose.generateKeyPair('RS256', { extractable: true });
const signingKey = { ...(await jose.exportJWK(privateKey)), kid: 'test-key', alg: 'RS256', use: 'sig' };

const provider = new Provider(ISSUER, {
  clients: [{
    client_id: process.env.CLIENT_ID,
    client_secret: process.env.CLIENT_SECRET,
    redirect_uris: [process.env.REDIRECT_URI],
    // Where its end-session endpoint (/session/end) may send the browser back: the portal's
    // login pages.
    post_logout_redirect_uris: (process.env.POST_LOGOUT_REDIRECT_URIS || '').split(' ').filter(Boolean),
    token_endpoint_auth_method: 'client_secret_post',
  }],
  jwks: { keys: [signingKey] },
  cookies: { keys: ['test-cookie-key'] },
  // The portal may read the groups from the ID token alone (as with Entra ID), so scope claims
  // go into it too, not only to userinfo.
  conformIdTokenClaims: false,
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'preferred_username'],
    groups: ['groups'],
  },
  scopes: ['openid', 'email', 'profile', 'groups'],
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: false },
    rpInitiatedLogout: { enabled: true, logoutSource },
  },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  async findAccount(ctx, id) {
    const user = state().users[id];
    if (!user) return undefined;
    return {
      accountId: id,
      async claims() {
        const current = state().users[id] || user; // groups as they are now, at each token
        return {
          sub: id,
          preferred_username: id,
          name: current.name || id,
          email: current.email || `${id}@example.org`,
          email_verified: true,
          groups: current.groups || [],
        };
      },
    };
  },
  // A first-party client: no consent page, the grant covers what it asks.
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId
      || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope('openid email profile groups');
    await grant.save();
    return grant;
  },
});
provider.proxy = false;

// The end-session endpoint's "sign out?" page, as the library's default without its web font.
async function logoutSource(ctx, form) {
  ctx.body = `<!doctype html><html><head><title>Sign out</title></head><body>
<h1>Sign out of the test identity provider?</h1>
${form}
<button autofocus type="submit" form="op.logoutForm" value="yes" name="logout">Yes, sign me out</button>
<button type="submit" form="op.logoutForm">No, stay signed in</button>
</body></html>`;
}

function loginPage(uid, message) {
  return `<!doctype html><html><head><title>Test identity provider</title></head><body>
<h1>Sign in to the test identity provider</h1>
${message ? `<p class="error">${escapeHtml(message)}</p>` : ''}
<form method="post" action="/interaction/${escapeHtml(uid)}/login">
<p><label>Username <input name="username" autofocus></label></p>
<p><label>Password <input name="password" type="password"></label></p>
<button type="submit">Sign in</button>
</form></body></html>`;
}

async function formBody(req) {
  let raw = '';
  for await (const chunk of req) raw += chunk;
  return Object.fromEntries(new URLSearchParams(raw));
}

async function reSign(payload) {
  return new jose.SignJWT(payload)
    .setProtectedHeader({ alg: 'RS256', kid: signingKey.kid, typ: 'JWT' })
    .sign(privateKey);
}

async function brokenIdToken(idToken, how) {
  const payload = jose.decodeJwt(idToken);
  const now = Math.floor(Date.now() / 1000);
  if (how === 'expired') return reSign({ ...payload, iat: now - 7200, exp: now - 3600 });
  if (how === 'wrong-issuer') return reSign({ ...payload, iss: IMPOSTOR_ISSUER });
  if (how === 'tampered') {
    // Someone on the way adds an admin group; the signature is the provider's, over the old payload.
    const [header, , signature] = idToken.split('.');
    const forged = { ...payload, groups: [...(payload.groups || []), 'gpu-admins'] };
    return `${header}.${jose.base64url.encode(JSON.stringify(forged))}.${signature}`;
  }
  throw new Error(`unknown id_token switch ${how}`);
}

provider.use(async (ctx, next) => {
  const login = ctx.path.match(/^\/interaction\/([^/]+)(\/login)?$/);
  if (login) {
    const details = await provider.interactionDetails(ctx.req, ctx.res);
    if (ctx.method === 'GET') {
      ctx.type = 'html';
      ctx.body = loginPage(details.uid);
      return;
    }
    const { username, password } = await formBody(ctx.req);
    const user = state().users[username];
    if (!user || user.password !== password) {
      ctx.type = 'html';
      ctx.body = loginPage(details.uid, 'Wrong username or password.');
      return;
    }
    ctx.redirect(await provider.interactionResult(ctx.req, ctx.res, {
      login: { accountId: username },
    }, { mergeWithLastSubmission: false }));
    return;
  }
  await next();
  const location = new URL(ctx.response.get('Location') || '/', ISSUER);
  const backWithCode = `${location.origin}${location.pathname}` === process.env.REDIRECT_URI
    && location.searchParams.has('code');
  if (state().down_after_code && backWithCode) {
    server.close(); // new connections (the portal's token request) are refused from now on
    ctx.res.on('finish', () => process.exit(0));
  }
  const how = state().id_token || 'genuine';
  if (ctx.path === '/token' && ctx.status === 200 && how !== 'genuine' && ctx.body?.id_token) {
    ctx.body = { ...ctx.body, id_token: await brokenIdToken(ctx.body.id_token, how) };
  }
});

const server = provider.listen(PORT, '127.0.0.1', () => {
  console.log(`oidc-provider listening on ${ISSUER}`);
});
