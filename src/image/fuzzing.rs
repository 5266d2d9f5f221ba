//! Entry point for the registry fuzz target (tests/fuzz): what a registry
//! sends, parsed as a pull parses it. Arbitrary bytes may fail, never panic.

use super::manifest::{Document, ImageConfig, host_platform, select_platform};

/// A manifest or index, an image config, a token answer's error body and a
/// WWW-Authenticate challenge, all from the same bytes; and, from an index,
/// the platform a pull would pick and the blob path of each digest named.
pub fn registry_documents(data: &[u8]) {
    if let Ok(document) = serde_json::from_slice::<Document>(data) {
        let _ = document.is_index("application/vnd.oci.image.index.v1+json");
        let _ = select_platform(&document.manifests, &host_platform());
        for descriptor in document.layers.iter().chain(&document.config) {
            let _ = super::store::digest_hex(&descriptor.digest);
        }
    }
    let _ = serde_json::from_slice::<ImageConfig>(data);
    let text = String::from_utf8_lossy(data);
    let _ = super::registry::parse_challenge(&text);
    let _ = super::registry::error_detail(data);
    let _ = super::reference::Reference::parse(&text);
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fuzz_corpus_runs() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz/corpus/registry");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            super::registry_documents(&std::fs::read(entry.unwrap().path()).unwrap());
            seen += 1;
        }
        assert!(seen > 0, "{} is empty", dir.display());
    }
}
