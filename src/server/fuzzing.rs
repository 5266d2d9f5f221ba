//! Entry points for the fuzz targets (tests/fuzz): the kubelet API's
//! parsers of what a client sends, reachable from outside the crate only
//! here. Each takes arbitrary bytes and may fail, never panic.

/// A request's query string, as every handler parses it: pairs, then the
/// containerLogs options and the port-forward ports.
pub fn kubelet_query(data: &[u8]) {
    let query = String::from_utf8_lossy(data);
    let pairs = super::parse_query(&query);
    let _ = super::log_options("ns", "pod", "c", &pairs);
    let _ = super::port_forward::websocket_ports(&pairs);
    let _ = crate::helpers::percent_decode(&query, crate::helpers::Plus::Plus);
}

/// A certificate, as a client shows it or the API server issues it.
pub fn x509(data: &[u8]) {
    let _ = crate::certificates::x509::parse(data);
    let _ = crate::certificates::x509::subject(data);
}

/// SPDY header blocks: inflated as one connection's stream would be, in
/// pieces split at the input's first byte, then decoded; and the raw block.
pub fn spdy_headers(data: &[u8]) {
    let _ = super::spdy::headers::decode(data);
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let (first, second) = rest.split_at(usize::from(split).min(rest.len()));
    let mut inflater = super::spdy::headers::Inflater::default();
    for block in [first, second] {
        match inflater.inflate(block) {
            Ok(inflated) => {
                let _ = super::spdy::headers::decode(&inflated);
            }
            Err(_) => return,
        }
    }
}

/// A SPDY session fed `data` as what the client sent: frames, streams,
/// header blocks; the streams it opens are taken and read to their end.
pub fn spdy_session(data: &[u8]) {
    let data = data.to_vec();
    crate::rt::block_on(async move {
        let (streams, writer) = super::spdy::serve(Sink, data);
        while let Ok(stream) = streams.recv().await {
            while stream.data.recv().await.is_ok() {}
        }
        drop(writer);
    });
}

/// WebSocket frames from a client, read as messages until the end.
pub fn websocket_frames(data: &[u8]) {
    let data = data.to_vec();
    crate::rt::block_on(async move {
        let mut reader = super::websocket::Reader::new(futures_lite::io::empty(), data);
        while let Ok(super::websocket::Incoming::Message(_) | super::websocket::Incoming::Ping(_)) =
            reader.next().await
        {}
    });
}

/// A peer that has sent everything already and takes whatever is written.
struct Sink;

impl futures_lite::AsyncRead for Sink {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        _: &mut [u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(Ok(0))
    }
}

impl futures_lite::AsyncWrite for Sink {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_close(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    /// The entry points run on the corpus kept for them: what the fuzz
    /// targets start from parses without a panic on stable too.
    #[test]
    fn the_fuzz_corpora_run() {
        let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz/corpus");
        type Target = (&'static str, fn(&[u8]));
        let targets: [Target; 4] = [
            ("kubelet_query", super::kubelet_query),
            ("spdy_headers", super::spdy_headers),
            ("spdy_session", super::spdy_session),
            ("websocket", super::websocket_frames),
        ];
        for (target, run) in targets {
            let dir = corpus.join(target);
            let mut seen = 0;
            for entry in std::fs::read_dir(&dir).unwrap() {
                run(&std::fs::read(entry.unwrap().path()).unwrap());
                seen += 1;
            }
            assert!(seen > 0, "{} is empty", dir.display());
        }
    }
}
