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

        /// A deployment secret mixed into scope digests, so that digests of
        /// low-entropy credentials (Basic auth) in Redis key names cannot be
        /// brute-forced offline. Use the same secret on every node.
        pub fn scope_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
            self.scope.secret = secret.as_ref().to_vec();
            self
        }
    };
}
