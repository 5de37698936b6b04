//! Bearer tokens, stored as SHA-256 digests and scoped to tenants and roles.
//!
//! A request's token is hashed and compared in constant time with every
//! configured digest (all of them, so timing does not tell which matched).
//! No token or an unknown one is 401; a token without the route's role is 403;
//! another tenant's message or stream is 404 to it, and publishing (or
//! appending) to another tenant 403.
//! With no tokens configured the API is open (the configuration allows that
//! on loopback addresses only) and every request acts with every role.
//!
//! The dashboard signs in once (`POST /v1/session`) and gets a session
//! ([`crate::sessions`]) whose id an `HttpOnly`, `SameSite=Strict` cookie
//! ([`SESSION_COOKIE`]) carries; the cookie stands for the bearer header when
//! a request has none, with the session's token's tenants and roles. The
//! cookie holds no token. A state change authenticated by it must also carry
//! an `Origin` header (which [`crate::guard`] has already checked to be the
//! daemon's own or an allowed one), so a cross-site form, or a request from a
//! browser that sends the cookie cross-site, cannot act with it. A request
//! carrying more than one session cookie (another page of the same site can
//! set one for a narrower path) is refused.
//! Recognised callers are held to their tenant's request rate and refused
//! callers counted per address ([`crate::limits`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, Method};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{decode_sha256, ConfigError, Role, TokenConfig};
use crate::error::ApiError;
use crate::limits::{retry_after_seconds, ClientAddr, LimitSettings, Limits};
use crate::metrics::RATE_LIMITED;
use crate::sessions::Sessions;

/// The cookie a dashboard session's id travels in.
pub const SESSION_COOKIE: &str = "courier_session";

/// The longest token the daemon reads (a configured token is hashed, so
/// longer ones are refused rather than hashed).
pub const MAX_TOKEN_BYTES: usize = 4096;

/// The `Set-Cookie` value that keeps session `id` for the dashboard: never
/// readable by scripts, not sent with requests other sites start, and only
/// over HTTPS when `secure` (the page was reached over HTTPS).
pub fn session_cookie(id: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{SESSION_COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict{secure}")
}

/// The `Set-Cookie` value that ends a dashboard session.
pub fn cleared_session_cookie() -> String {
    format!("{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// The session id a request's cookie carries: `None` without the cookie,
/// `Some(Err)` when it carries several (a page of another port or path of
/// the same site may have set one: which the browser sends first is not
/// ours to choose).
pub fn session_id(headers: &HeaderMap) -> Option<Result<String, ApiError>> {
    let mut values = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value.trim().to_owned());
    let first = values.next()?;
    if values.next().is_some() {
        return Some(Err(ApiError::unauthorized(format!(
            "the request carries more than one {SESSION_COOKIE} cookie; sign in again"
        ))));
    }
    Some(Ok(first))
}

/// Whether a request authenticates by the dashboard's cookie rather than a
/// bearer header.
fn by_session(headers: &HeaderMap) -> bool {
    headers.get(header::AUTHORIZATION).is_none() && session_id(headers).is_some()
}

/// The tenants a token sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantScope {
    /// Every tenant (`["*"]`, or an open API).
    All,
    /// Only these.
    Only(BTreeSet<String>),
}

impl TenantScope {
    /// Whether `tenant` is visible.
    pub fn allows(&self, tenant: &str) -> bool {
        match self {
            TenantScope::All => true,
            TenantScope::Only(tenants) => tenants.contains(tenant),
        }
    }

    /// The tenants to filter a listing by (`None`: every tenant).
    pub fn filter(&self) -> Option<Vec<String>> {
        match self {
            TenantScope::All => None,
            TenantScope::Only(tenants) => Some(tenants.iter().cloned().collect()),
        }
    }
}

/// Who is calling: the token's name, tenants and roles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The token's name; `None` on an open API.
    pub name: Option<String>,
    /// The tenants it sees.
    pub tenants: TenantScope,
    /// What it may do.
    pub roles: BTreeSet<Role>,
}

impl Principal {
    fn open() -> Self {
        Self {
            name: None,
            tenants: TenantScope::All,
            roles: [Role::Admin, Role::Consume, Role::Publish, Role::Read]
                .into_iter()
                .collect(),
        }
    }

    /// Whether the principal holds `role` (`admin` implies `read`).
    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&role) || (role == Role::Read && self.roles.contains(&Role::Admin))
    }

    /// 403 unless the principal holds `role`.
    pub fn require(&self, role: Role) -> Result<(), ApiError> {
        if self.has(role) {
            Ok(())
        } else {
            Err(ApiError::forbidden(
                format!(
                    "token {:?} lacks the `{role}` role",
                    self.name.as_deref().unwrap_or("")
                ),
                None,
            ))
        }
    }

    /// 403 (naming `field`) unless the principal may act for `tenant`.
    pub fn require_tenant(&self, tenant: &str, field: &str) -> Result<(), ApiError> {
        if self.tenants.allows(tenant) {
            Ok(())
        } else {
            Err(ApiError::forbidden(
                format!("this token is not scoped to tenant {tenant:?}"),
                Some(field.to_owned()),
            ))
        }
    }
}

struct TokenEntry {
    name: String,
    sha256: [u8; 32],
    tenants: TenantScope,
    roles: BTreeSet<Role>,
}

/// Checks bearer tokens against the configured digests, and the request
/// limits ([`crate::limits`]) of the callers it recognises or refuses.
pub struct Authenticator {
    tokens: Vec<TokenEntry>,
    limits: Limits,
    sessions: Sessions,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field(
                "tokens",
                &self.tokens.iter().map(|t| &t.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Authenticator {
    /// An authenticator for `tokens`; none makes the API open.
    pub fn new(tokens: &[TokenConfig]) -> Result<Self, ConfigError> {
        let mut entries = Vec::with_capacity(tokens.len());
        for (i, token) in tokens.iter().enumerate() {
            let sha256 = decode_sha256(&token.sha256).map_err(|reason| ConfigError::Invalid {
                key: format!("tokens[{i}].sha256"),
                value: None,
                reason,
            })?;
            let tenants = if token.tenants.iter().any(|t| t == "*") {
                TenantScope::All
            } else {
                TenantScope::Only(token.tenants.iter().cloned().collect())
            };
            entries.push(TokenEntry {
                name: token.name.clone(),
                sha256,
                tenants,
                roles: token.roles.iter().copied().collect(),
            });
        }
        Ok(Self {
            tokens: entries,
            limits: Limits::new(LimitSettings::OFF),
            sessions: Sessions::default(),
        })
    }

    /// The same tokens, with request limits (an open API has none).
    pub fn with_limits(mut self, settings: LimitSettings) -> Self {
        self.limits = Limits::new(settings);
        self
    }

    /// An open API: every request may do everything.
    pub fn open() -> Self {
        Self {
            tokens: Vec::new(),
            limits: Limits::new(LimitSettings::OFF),
            sessions: Sessions::default(),
        }
    }

    /// [`Authenticator::authenticate`] for a request from `client`, within
    /// the limits: 429 for an address past its failed authentications (a
    /// valid token included) or a tenant past its request rate. A request
    /// without a known client address (a router served by other means than
    /// the daemon's server) has no address limit.
    pub fn admit(
        &self,
        headers: &HeaderMap,
        client: Option<ClientAddr>,
    ) -> Result<Principal, ApiError> {
        if self.is_open() {
            return Ok(Principal::open());
        }
        if let Some(left) = client.and_then(|c| self.limits.blocked(c.0)) {
            metrics::counter!(RATE_LIMITED, "limit" => "auth_failures").increment(1);
            return Err(ApiError::too_many_requests(
                "too many failed authentications from this address; try again later",
                retry_after_seconds(left),
            ));
        }
        let principal = match self.authenticate(headers) {
            Ok(principal) => principal,
            Err(error) => {
                if let Some(client) = client {
                    self.limits.failed(client.0);
                }
                return Err(error);
            }
        };
        let key = match &principal.tenants {
            TenantScope::Only(tenants) if tenants.len() == 1 => {
                tenants.iter().next().map(|t| format!("tenant:{t}"))
            }
            _ => None,
        }
        .unwrap_or_else(|| format!("token:{}", principal.name.as_deref().unwrap_or_default()));
        if let Err(wait) = self.limits.take(&key) {
            metrics::counter!(RATE_LIMITED, "limit" => "tenant_requests").increment(1);
            return Err(ApiError::too_many_requests(
                "this tenant is over its request rate (server.tenant_requests_per_second); \
                 slow down",
                retry_after_seconds(wait),
            ));
        }
        Ok(principal)
    }

    /// Whether no tokens are configured.
    pub fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The principal of a request, from its `Authorization: Bearer` header
    /// or, without one, from the dashboard's session cookie.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        if self.is_open() {
            return Ok(Principal::open());
        }
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return match session_id(headers) {
                Some(id) => {
                    let digest = self.sessions.token_digest(&id?).ok_or_else(|| {
                        ApiError::unauthorized("the dashboard session has ended; sign in again")
                    })?;
                    self.principal_of_digest(&digest)
                }
                None => Err(ApiError::unauthorized(
                    "missing `Authorization: Bearer <token>` header",
                )),
            };
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                ApiError::unauthorized("the Authorization header must be `Bearer <token>`")
            })?;
        self.principal_of(token)
    }

    /// Starts a dashboard session for `token` (which [`Authenticator::admit`]
    /// has accepted) and returns its id for the cookie.
    pub fn start_session(&self, token: &str) -> String {
        self.sessions.start(Sha256::digest(token.as_bytes()).into())
    }

    /// Ends the session whose id the request's cookie carries, if any.
    pub fn end_session(&self, headers: &HeaderMap) {
        if let Some(Ok(id)) = session_id(headers) {
            self.sessions.end(&id);
        }
    }

    /// The principal `token` stands for; 401 for an unknown one.
    fn principal_of(&self, token: &str) -> Result<Principal, ApiError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(ApiError::unauthorized("unknown token"));
        }
        self.principal_of_digest(&Sha256::digest(token.as_bytes()).into())
    }

    /// The principal of the token whose SHA-256 is `digest`; 401 for one not
    /// (or no longer) configured. Every digest is compared, in constant time.
    fn principal_of_digest(&self, digest: &[u8; 32]) -> Result<Principal, ApiError> {
        let mut found: Option<&TokenEntry> = None;
        for entry in &self.tokens {
            if bool::from(entry.sha256.ct_eq(digest)) {
                found = Some(entry);
            }
        }
        let entry = found.ok_or_else(|| ApiError::unauthorized("unknown token"))?;
        Ok(Principal {
            name: Some(entry.name.clone()),
            tenants: entry.tenants.clone(),
            roles: entry.roles.clone(),
        })
    }
}

impl<S> FromRequestParts<S> for Principal
where
    S: Send + Sync,
    Arc<Authenticator>: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let client = parts.extensions.get::<ClientAddr>().copied();
        let authenticator = Arc::<Authenticator>::from_ref(state);
        let principal = authenticator.admit(&parts.headers, client)?;
        if !authenticator.is_open() && changes_state(&parts.method) && by_session(&parts.headers) {
            require_origin(&parts.headers)?;
        }
        Ok(principal)
    }
}

/// Whether `method` may change state (everything but GET, HEAD, OPTIONS).
fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// 403 unless the request names the page it comes from: a dashboard
/// session's state changes must come from the dashboard (browsers send
/// `Origin` with every such request, and the guard has checked it).
fn require_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    if headers.contains_key(header::ORIGIN) {
        Ok(())
    } else {
        Err(ApiError::forbidden(
            "a change made with the dashboard's session must come from the dashboard's page \
             (an Origin header); programs send `Authorization: Bearer <token>` instead",
            Some("origin".into()),
        ))
    }
}

macro_rules! role_extractor {
    ($name:ident, $role:expr, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone)]
        pub struct $name(pub Principal);

        impl<S> FromRequestParts<S> for $name
        where
            S: Send + Sync,
            Arc<Authenticator>: FromRef<S>,
        {
            type Rejection = ApiError;

            async fn from_request_parts(
                parts: &mut Parts,
                state: &S,
            ) -> Result<Self, Self::Rejection> {
                let principal = Principal::from_request_parts(parts, state).await?;
                principal.require($role)?;
                Ok($name(principal))
            }
        }
    };
}

role_extractor!(
    Publisher,
    Role::Publish,
    "A caller holding the `publish` role (checked before the body is read)."
);
role_extractor!(
    Reader,
    Role::Read,
    "A caller holding the `read` role, or `admin`."
);
role_extractor!(Admin, Role::Admin, "A caller holding the `admin` role.");
role_extractor!(
    Consumer,
    Role::Consume,
    "A caller holding the `consume` role (reads, acks and claims through a stream's group)."
);

#[cfg(test)]
mod tests {
    use super::*;

    fn token(name: &str, secret: &str, tenants: &[&str], roles: &[Role]) -> TokenConfig {
        TokenConfig {
            name: name.into(),
            sha256: hex::encode(Sha256::digest(secret.as_bytes())),
            tenants: tenants.iter().map(|t| (*t).to_owned()).collect(),
            roles: roles.to_vec(),
        }
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Ok(value) = format!("Bearer {token}").parse() {
            headers.insert(header::AUTHORIZATION, value);
        }
        headers
    }

    #[test]
    fn tokens_are_matched_by_digest_and_carry_their_scope() {
        let auth = Authenticator::new(&[
            token("a", "secret-a", &["acme"], &[Role::Publish]),
            token("ops", "secret-ops", &["*"], &[Role::Admin]),
        ])
        .unwrap();
        let a = auth.authenticate(&bearer("secret-a")).unwrap();
        assert_eq!(a.name.as_deref(), Some("a"));
        assert!(a.tenants.allows("acme") && !a.tenants.allows("globex"));
        assert!(a.has(Role::Publish) && !a.has(Role::Read));
        let ops = auth.authenticate(&bearer("secret-ops")).unwrap();
        assert!(ops.has(Role::Read) && ops.has(Role::Admin) && !ops.has(Role::Publish));
        assert_eq!(ops.tenants, TenantScope::All);
        for headers in [bearer("wrong"), HeaderMap::new(), bearer("")] {
            let err = auth.authenticate(&headers).unwrap_err();
            assert_eq!(err.status, axum::http::StatusCode::UNAUTHORIZED);
        }
    }

    fn cookie(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Ok(value) = value.parse() {
            headers.insert(header::COOKIE, value);
        }
        headers
    }

    #[test]
    fn a_session_cookie_carries_an_id_that_stands_for_the_token_not_the_token() {
        let auth = Authenticator::new(&[
            token("a", "secret-a", &["acme"], &[Role::Read]),
            token("ops", "secret-ops", &["*"], &[Role::Admin]),
        ])
        .unwrap();
        let id = auth.start_session("secret-a");
        let set = session_cookie(&id, false);
        assert!(!set.contains(&hex::encode("secret-a")) && !set.contains("secret-a"));
        assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"));
        assert!(!set.contains("Secure") && session_cookie(&id, true).ends_with("; Secure"));
        let value = set.split(';').next().unwrap();
        let a = auth
            .authenticate(&cookie(&format!("theme=dark; {value}; other=1")))
            .unwrap();
        assert_eq!(a.name.as_deref(), Some("a"));
        assert!(a.tenants.allows("acme") && !a.tenants.allows("globex"));
        // The bearer header wins over the cookie.
        let mut both = cookie(value);
        both.insert(header::AUTHORIZATION, "Bearer secret-ops".parse().unwrap());
        assert_eq!(
            auth.authenticate(&both).unwrap().name.as_deref(),
            Some("ops")
        );
        // Two session cookies (one planted for a narrower path): refused.
        let other = auth.start_session("secret-ops");
        let planted = format!("{SESSION_COOKIE}={other}; {value}");
        assert!(auth.authenticate(&cookie(&planted)).is_err());
        for bad in [
            format!("{SESSION_COOKIE}=zz"),
            format!("{SESSION_COOKIE}="),
            format!("{SESSION_COOKIE}={}", hex::encode("secret-a")),
            format!("{SESSION_COOKIE}={}", hex::encode([9_u8; 32])),
        ] {
            let err = auth.authenticate(&cookie(&bad)).unwrap_err();
            assert_eq!(err.status, axum::http::StatusCode::UNAUTHORIZED, "{bad}");
        }
        // Signing out ends it; another authenticator (a restart) never knew it.
        auth.end_session(&cookie(value));
        assert!(auth.authenticate(&cookie(value)).is_err());
        let restarted =
            Authenticator::new(&[token("a", "secret-a", &["acme"], &[Role::Read])]).unwrap();
        let other_cookie = format!("{SESSION_COOKIE}={other}");
        assert!(restarted.authenticate(&cookie(&other_cookie)).is_err());
        assert!(cleared_session_cookie().contains("Max-Age=0"));
    }

    #[test]
    fn no_tokens_is_open() {
        let auth = Authenticator::open();
        assert!(auth.is_open());
        let principal = auth.authenticate(&HeaderMap::new()).unwrap();
        assert!(principal.has(Role::Admin) && principal.has(Role::Publish));
    }
}
