/// The scope setters shared by the HTTP and gRPC builders (a field
/// `scope: ScopeConfig` is expected).
macro_rules! scope_setters {
    () => {
        /// Where the tenant scope comes from (default:
        /// [`Scope::credentials`](crate::http::Scope::credentials)).
        pub fn scope(mut self, scope: crate::http::Scope) -> Self {
            self.scope.scope = scope;
            self
        }

        /// Lets every user share results with every other user.
        ///
        /// # Warning
        ///
        /// See [`Scope::shared_across_users`](crate::http::Scope::shared_across_users):
        /// the answer computed for one user is handed to another. Only for
        /// responses that do not depend on who asks.
        pub fn shared_across_users(self) -> Self {
            self.scope(crate::http::Scope::shared_across_users())
        }

        /// A deployment secret that keys scope digests (BLAKE3 keyed mode,
        /// under a key derived from it), so that digests of low-entropy
        /// credentials (a Basic-auth password, a short API key) seen in
        /// Redis key names cannot be checked offline against guesses. Use
        /// the same random secret (32 bytes or more) on every node; an
        /// empty one, or one shorter than
        /// [`MIN_SCOPE_SECRET_LEN`](crate::http::MIN_SCOPE_SECRET_LEN)
        /// (16 bytes), is a configuration error. Without a secret, a layer
        /// that stores results in a shared backend warns at build (see
        /// [`Scope`](crate::http::Scope#why-a-scope-secret-matters)).
        pub fn scope_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
            self.scope.secret = crate::http::scope::Secret::new(secret.as_ref());
            self
        }

        /// Adds a header to the credentials that scope requests (by default
        /// [`DEFAULT_CREDENTIAL_HEADERS`](crate::http::DEFAULT_CREDENTIAL_HEADERS):
        /// `Authorization`, `Proxy-Authorization`, `Cookie`, `X-Api-Key`),
        /// e.g. an API-key header of your own. Requests with different
        /// values of it never share. Applies to
        /// [`Scope::credentials`](crate::http::Scope::credentials) only:
        /// with another scope rule, `build()` fails.
        pub fn credential_header(mut self, name: &str) -> Self {
            self.scope.add.push(name.to_owned());
            self
        }

        /// Removes a header from the credentials that scope requests.
        /// Applies to [`Scope::credentials`](crate::http::Scope::credentials)
        /// only: with another scope rule, `build()` fails; removing every
        /// header fails too.
        ///
        /// # Warning
        ///
        /// Requests that differ only in that header share results: remove
        /// only a header that says nothing about who sent the request.
        pub fn remove_credential_header(mut self, name: &str) -> Self {
            self.scope.remove.push(name.to_owned());
            self
        }
    };
}

/// What a deployment's configuration may still change on built rules, and
/// what it needs to know of them, shared by the HTTP and gRPC extractors
/// (a field `config: Arc<Config>` with a `scope: ScopeConfig` is expected).
macro_rules! extractor_scope_methods {
    () => {
        /// Whether requests get tenant scope digests that no scope secret
        /// keys: they can be checked offline against guessed credentials
        /// by whoever reads them where they are stored (Redis key names).
        /// False with a secret, and with no scope at all
        /// (`shared_across_users`).
        pub fn scope_digests_unkeyed(&self) -> bool {
            self.config.scope.unkeyed()
        }

        /// These rules with their scope digests keyed by `secret` (see the
        /// builder's `scope_secret`): for a secret the deployment gives
        /// (an environment variable) to rules built in code. The same
        /// secret again changes nothing; an empty or short one (see
        /// `scope_secret`), or another secret than the one already set, is
        /// an error.
        pub fn with_scope_secret(
            mut self,
            secret: impl AsRef<[u8]>,
        ) -> Result<Self, crate::error::KeyConfigError> {
            std::sync::Arc::make_mut(&mut self.config)
                .scope
                .set_secret(secret.as_ref())?;
            Ok(self)
        }
    };
}
