//! Generated gRPC types and services for `toolgrid.v1` (see `proto/toolgrid/v1/`).

#![allow(clippy::all, missing_docs)]

tonic::include_proto!("toolgrid.v1");
