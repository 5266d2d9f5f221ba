//! What a registry sends: manifests, indexes, image configs, challenges,
//! error bodies and references.
//! It may fail on any input, never panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    nanolet::image::fuzzing::registry_documents(data);
});
