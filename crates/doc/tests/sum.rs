//! `sum` of numbers written as strings: Flow's arbitrary-precision sums, through both the
//! reference reduction (`Reducer::reduce`, over `Value`s) and the combiner's compact one
//! (`Reducer::reduce_docs`), which must agree value for value and error for error.

use proptest::prelude::*;
use serde_json::{Value, json};
use sluice_doc::compact::Doc;
use sluice_doc::{ReduceError, Reducer, Schema};

fn summing() -> Reducer {
    let schema = json!({"reduce": {"strategy": "sum"}});
    Schema::compile(&schema).unwrap().reducer().clone()
}

/// Folds `docs` left to right on both paths; they must agree (values, errors and the
/// compact side's reported heap changes), and that result is returned.
fn fold(docs: &[Value]) -> Result<Value, ReduceError> {
    let reducer = summing();
    let mut value = docs[0].clone();
    let by_value = docs[1..]
        .iter()
        .try_for_each(|doc| reducer.reduce(&mut value, doc.clone(), false))
        .map(|()| value);
    let mut doc = Doc::from(&docs[0]);
    let mut estimate = doc.heap_size() as isize;
    let by_doc = docs[1..]
        .iter()
        .try_for_each(|rhs| -> Result<(), ReduceError> {
            estimate += reducer.reduce_docs(&mut doc, Doc::from(rhs), false)?;
            assert_eq!(estimate, doc.heap_size() as isize, "reported heap change");
            Ok(())
        })
        .map(|()| Value::from(doc));
    match (&by_value, &by_doc) {
        (Ok(v), Ok(d)) => assert_eq!(v, d, "compact and value sums of {docs:?}"),
        (Err(v), Err(d)) => assert_eq!(v.to_string(), d.to_string(), "errors of {docs:?}"),
        _ => panic!("value {by_value:?} vs compact {by_doc:?} for {docs:?}"),
    }
    by_value
}

/// Flow's own sequence of string-encoded sums (its reducer's tests): a string operand
/// makes the total an exact decimal string, whatever the other side is; a float joins it
/// with 16 significant digits, and the total keeps the largest scale of its operands.
#[test]
fn numeric_strings_add_with_arbitrary_precision_into_strings() {
    let steps = [
        (json!("1"), json!("1")),
        (json!("9000000000000000000"), json!("9000000000000000001")),
        (json!("10000000000000000000"), json!("19000000000000000001")),
        (json!(1_233), json!("19000000000000001234")),
        (json!(-10_000), json!("18999999999999991234")),
        (json!(86753.09), json!("19000000000000077987.09000000000")),
        (
            json!("10203.040506070812"),
            json!("19000000000000088190.130506070812"),
        ),
    ];
    let mut docs = vec![json!(0)];
    for (rhs, want) in steps {
        docs.push(rhs);
        assert_eq!(fold(&docs).unwrap(), want, "after {docs:?}");
    }
}

#[test]
fn the_result_is_a_string_exactly_when_an_operand_is_one() {
    for (docs, want) in [
        (vec![json!(2), json!(3)], json!(5)),
        (vec![json!(2), json!(0.5)], json!(2.5)),
        (vec![json!("2"), json!(3)], json!("5")),
        (vec![json!(2), json!("0.5")], json!("2.5")),
        (vec![json!("0.1"), json!(0.2)], json!("0.3000000000000000")),
        (vec![json!("1.50"), json!("1.50")], json!("3.00")),
        (vec![json!("1e3"), json!(-1)], json!("999")),
        (vec![json!("-0.5"), json!("+0.5")], json!("0.0")),
        (
            vec![json!(u64::MAX), json!("1")],
            json!("18446744073709551616"),
        ),
        (
            vec![json!(i64::MIN), json!("-1")],
            json!("-9223372036854775809"),
        ),
    ] {
        assert_eq!(fold(&docs).unwrap(), want, "{docs:?}");
    }
}

/// Flow's decimals keep their scale: a total has as many fractional digits as the operand
/// with most, trailing zeros included; an integer has none.
#[test]
fn a_string_total_keeps_the_scale_of_its_operands() {
    for (docs, want) in [
        (vec![json!("1.50"), json!("2.25")], json!("3.75")),
        (vec![json!("1.10"), json!("2")], json!("3.10")),
        (vec![json!("1.10"), json!(2)], json!("3.10")),
        (vec![json!("0.5"), json!("0.50"), json!("1")], json!("2.00")),
        (vec![json!("2.000"), json!("-2")], json!("0.000")),
        (vec![json!("-1.25"), json!("0.05")], json!("-1.20")),
        (vec![json!("1e2"), json!("0.10")], json!("100.10")),
        (vec![json!("1.5e1"), json!(1)], json!("16")),
    ] {
        assert_eq!(fold(&docs).unwrap(), want, "{docs:?}");
    }
}

/// Integers still overflow past the i64/u64 range as numbers (Flow's rule: only strings
/// are arbitrary), which the same total written as a string does not.
#[test]
fn bounded_numbers_overflow_where_strings_do_not() {
    let err = fold(&[json!(u64::MAX), json!(1)]).unwrap_err();
    assert_eq!(err.location, "");
    assert!(err.reason.starts_with("sum overflows"), "{err}");
    assert_eq!(
        fold(&[json!(u64::MAX.to_string()), json!(1)]).unwrap(),
        json!("18446744073709551616")
    );
}

#[test]
fn a_string_total_wider_than_the_limit_overflows_naming_the_limit() {
    let err = fold(&[json!("1e5000"), json!("1")]).unwrap_err();
    assert!(err.reason.contains("sum overflows"), "{err}");
    assert!(err.reason.contains("4096 digits"), "{err}");
}

/// A string that spells no number is no operand, as a boolean is not: the error names the
/// location and quotes both sides.
#[test]
fn a_string_that_is_no_number_fails_like_any_non_number() {
    let schema = json!({
        "type": "object",
        "reduce": {"strategy": "merge"},
        "properties": {"total": {"reduce": {"strategy": "sum"}}}
    });
    let reducer = Schema::compile(&schema).unwrap().reducer().clone();
    for bad in ["1_000", " 1", "NaN", "one", ""] {
        let mut lhs = json!({"total": "5"});
        let err = reducer
            .reduce(&mut lhs, json!({"total": bad}), false)
            .unwrap_err();
        assert_eq!(err.location, "/total");
        assert!(err.reason.starts_with("sum needs two numbers"), "{err}");
        assert!(err.reason.contains("\"5\""), "{err}");
        let mut lhs = Doc::from(&json!({"total": "5"}));
        let compact = reducer
            .reduce_docs(&mut lhs, Doc::from(&json!({"total": bad})), false)
            .unwrap_err();
        assert_eq!(compact.to_string(), err.to_string());
    }
}

/// Numbers whose sums are exact on every path: integers, quarters, and decimal strings
/// of up to 40 digits (past every integer and float), some with exponents.
fn addend() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-(1i64 << 40)..(1i64 << 40)).prop_map(Value::from),
        (-(1i32 << 20)..(1 << 20)).prop_map(|k| json!(f64::from(k) / 4.0)),
        (
            "-?[0-9]{1,20}",
            prop::option::of("[0-9]{1,20}"),
            prop::option::of(-30i32..30)
        )
            .prop_map(|(whole, fraction, exponent)| {
                let mut s = whole;
                if let Some(f) = fraction {
                    s = format!("{s}.{f}");
                }
                if let Some(e) = exponent {
                    s = format!("{s}e{e}");
                }
                Value::String(s)
            }),
    ]
}

/// A string total without its trailing fractional zeros: its value, not its scale.
fn unscaled(v: &Value) -> Value {
    match v.as_str() {
        Some(s) if s.contains('.') => {
            let s = s.trim_end_matches('0').trim_end_matches('.');
            Value::String(if s == "-0" {
                "0".to_string()
            } else {
                s.to_string()
            })
        }
        _ => v.clone(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// `(a+b)+c == a+(b+c)`, each grouping computed on both paths: exactly, scale included,
    /// unless a float joins a decimal (its conversion's scale depends on the float, as in
    /// Flow), then in value.
    #[test]
    fn sums_of_numbers_and_numeric_strings_associate(a in addend(), b in addend(), c in addend()) {
        let floats = [&a, &b, &c].iter().any(|v| v.is_f64());
        let left = fold(&[a.clone(), b.clone(), c.clone()]);
        let bc = fold(&[b, c]);
        let right = bc.and_then(|bc| fold(&[a, bc]));
        match (left, right) {
            (Ok(l), Ok(r)) if floats => prop_assert_eq!(unscaled(&l), unscaled(&r)),
            (Ok(l), Ok(r)) => prop_assert_eq!(l, r),
            (l, r) => prop_assert!(false, "{:?} vs {:?}", l, r),
        }
    }
}
