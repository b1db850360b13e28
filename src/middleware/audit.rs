//! Audit records: built from a call (or a refusal), with excluded arguments left out.
//! CONTRACT(issue 10, helper E).
