//! Connections into a sandbox's network for the preview proxy go through the
//! runtime's socket maker, kept per init between requests.

use strata_runtime::fake::Op;

use super::harness::TestEngine;

#[tokio::test]
async fn previews_connect_through_the_runtime_and_keep_its_socket_maker() {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let id = e.sandbox("base", "web").await;
        let handle = crate::record::handle_of(&crate::record::load(&e.st, &id).expect("load")).expect("running");
        // The fake makes its sockets in this process's network: a listener here is "inside".
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("listen");
        let port = listener.local_addr().expect("addr").port();
        for _ in 0..3 {
            let stream = e.st.previews.connect(&e.st.runtime, &id, &handle, port).await.expect("connect");
            let crate::state::preview::Upstream::Left(stream) = stream else { panic!("a TCP connection") };
            assert_eq!(stream.peer_addr().expect("peer").port(), port);
            listener.accept().await.expect("accepted");
        }
        let makers = e.rt.actions(&id).iter().filter(|o| **o == Op::NetSockets).count();
        assert_eq!(makers, 1, "one socket maker for every connection to the same init");

        // Nothing listening: the error names the port, not a panic or a hang.
        drop(listener);
        let err = e.st.previews.connect(&e.st.runtime, &id, &handle, port).await.expect_err("refused");
        assert!(err.to_string().contains(&port.to_string()), "{err}");

        // A stopped sandbox has no network to connect into.
        crate::lifecycle::stop(&e.st, &id, "user", std::time::Duration::ZERO).await.expect("stop");
        e.st.previews.forget_connectors(&id);
        assert!(e.st.previews.connect(&e.st.runtime, &id, &handle, port).await.is_err());
    })
    .await;
}
