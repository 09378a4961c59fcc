//! What the derives accept (`ui/pass`: compiled and run) and how they report what they
//! refuse (`ui/fail`: compiled, and the errors compared with the `.stderr` beside each).
//! After an intended change of message: `TRYBUILD=overwrite cargo test -p onceflow-macros`,
//! then read the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
