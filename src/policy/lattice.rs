//! The access lattice: none < list < read < {create, append} < write.
//!
//! `create` and `append` are incomparable: each grants something the other does not
//! (new entries versus appending to existing files). Their meet — the most restrictive
//! level both include — is `read`; their join is `write`. Every comparison of access
//! levels in the crate goes through [`Access::includes`], [`Access::meet`] and
//! [`Access::join`]; `Access` has no `Ord` on purpose, so a `<` written against the old
//! total order cannot compile.
//!
//! Invariants (tested below and in `tests/policy_prop`): `includes` is a partial order;
//! `meet`/`join` are its greatest lower / least upper bounds (commutative, associative,
//! idempotent, absorbing); `rank` is a linear extension used only to pick a stable
//! representative, never to decide.

use super::Access;

impl Access {
    /// Every level, bottom first.
    pub const ALL: [Access; 6] = [
        Access::None,
        Access::List,
        Access::Read,
        Access::Create,
        Access::Append,
        Access::Write,
    ];

    /// The height in the lattice: none 0, list 1, read 2, create/append 3, write 4.
    fn height(self) -> u8 {
        match self {
            Access::None => 0,
            Access::List => 1,
            Access::Read => 2,
            Access::Create | Access::Append => 3,
            Access::Write => 4,
        }
    }

    /// Whether `self` allows everything `other` allows (`self >= other` in the lattice).
    pub fn includes(self, other: Access) -> bool {
        self == other || (self.height() > other.height() && !self.beside(other))
    }

    /// `create` and `append`: neither includes the other.
    fn beside(self, other: Access) -> bool {
        matches!(
            (self, other),
            (Access::Create, Access::Append) | (Access::Append, Access::Create)
        )
    }

    /// `self` is strictly above `other`.
    pub fn above(self, other: Access) -> bool {
        self != other && self.includes(other)
    }

    /// The most restrictive level both include (greatest lower bound).
    pub fn meet(self, other: Access) -> Access {
        if self.includes(other) {
            other
        } else if other.includes(self) {
            self
        } else {
            Access::Read // create ∧ append
        }
    }

    /// The least level including both (least upper bound).
    pub fn join(self, other: Access) -> Access {
        if self.includes(other) {
            self
        } else if other.includes(self) {
            other
        } else {
            Access::Write // create ∨ append
        }
    }

    /// A linear extension of the order (create before append), for stable tie-breaks only.
    pub fn rank(self) -> u8 {
        match self {
            Access::None => 0,
            Access::List => 1,
            Access::Read => 2,
            Access::Create => 3,
            Access::Append => 4,
            Access::Write => 5,
        }
    }

    /// Some mutation is allowed: `create`, `append` or `write`.
    pub fn mutates(self) -> bool {
        matches!(self, Access::Create | Access::Append | Access::Write)
    }
}

#[cfg(test)]
mod tests {
    use super::Access::{self, *};

    #[test]
    fn order_is_the_documented_lattice() {
        let chain = [None, List, Read, Write];
        for (i, a) in chain.iter().enumerate() {
            for b in &chain[..=i] {
                assert!(a.includes(*b), "{a} includes {b}");
            }
        }
        for mid in [Create, Append] {
            assert!(mid.includes(Read) && mid.includes(List) && mid.includes(None));
            assert!(Write.includes(mid) && !mid.includes(Write));
            assert!(!Read.includes(mid));
        }
        assert!(!Create.includes(Append) && !Append.includes(Create));
        assert_eq!(Create.meet(Append), Read);
        assert_eq!(Create.join(Append), Write);
    }

    #[test]
    fn lattice_laws_hold_for_every_triple() {
        for a in Access::ALL {
            assert!(a.includes(a));
            assert_eq!(a.meet(a), a);
            assert_eq!(a.join(a), a);
            for b in Access::ALL {
                assert_eq!(a.meet(b), b.meet(a));
                assert_eq!(a.join(b), b.join(a));
                assert_eq!(a.meet(a.join(b)), a, "absorption {a} {b}");
                assert_eq!(a.join(a.meet(b)), a, "absorption {a} {b}");
                assert!(a.includes(a.meet(b)) && b.includes(a.meet(b)));
                assert!(a.join(b).includes(a) && a.join(b).includes(b));
                if a.includes(b) && b.includes(a) {
                    assert_eq!(a, b, "antisymmetry");
                }
                assert_eq!(a.includes(b), a.meet(b) == b);
                if a.includes(b) {
                    assert!(a.rank() >= b.rank(), "rank extends the order");
                }
                for c in Access::ALL {
                    assert_eq!(a.meet(b).meet(c), a.meet(b.meet(c)));
                    assert_eq!(a.join(b).join(c), a.join(b.join(c)));
                    if a.includes(b) && b.includes(c) {
                        assert!(a.includes(c), "transitivity");
                    }
                    // The meet is the greatest lower bound.
                    if a.includes(c) && b.includes(c) {
                        assert!(a.meet(b).includes(c));
                    }
                }
            }
        }
    }
}
