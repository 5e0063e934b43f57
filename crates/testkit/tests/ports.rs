//! A port handed out stays claimed while the process lives: asked again, the search
//! (which starts at the same place each time) passes over it, though nothing listens.

use sluice_testkit::ports::free_port;
use std::collections::BTreeSet;

#[test]
fn a_port_handed_out_is_not_handed_out_again_while_the_process_lives() {
    let ports: Vec<u16> = (0..20).map(|_| free_port()).collect();
    let distinct: BTreeSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "{ports:?}");
    assert!(
        ports.iter().all(|p| (20_000..32_768).contains(p)),
        "{ports:?}"
    );
}
