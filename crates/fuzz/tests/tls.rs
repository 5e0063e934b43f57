//! Fuzz target of the DER walk that names a certificate's issuer (issue 34): a peer's
//! certificate is outside input, and whatever its bytes `issuer` gives a name or `None`,
//! never a panic or a hang. A bounded `#[test]` (2 s) after the corpus in
//! `tests/__fuzz__/<target>/corpus`, and coverage-guided on stable Rust with
//! `cargo bolero test -p sluice-fuzz <target>`: see docs/fuzzing.md.

use std::time::Duration;

#[test]
fn fuzz_issuer_names_or_declines_any_bytes() {
    bolero::check!()
        .with_test_time(Duration::from_secs(2))
        .with_iterations(usize::MAX)
        .with_max_len(4096)
        .for_each(|bytes: &[u8]| {
            if let Some(name) = sluice_tls::issuer(bytes) {
                // The name is built from the bytes: it cannot outgrow them by more than
                // the attribute labels it adds.
                assert!(name.len() <= 16 * bytes.len() + 16, "{name}");
            }
        });
}
