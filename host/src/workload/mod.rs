//! Workloads: the built-in Mixtral decoder layer and whole models of N of them, their TOML
//! description, and weights from safetensors files with transformers' Mixtral names.
//!
//! | module | holds |
//! |---|---|
//! | `config` | [`MixtralConfig`] (one layer's sizes) and [`WorkloadFile`] (the TOML file) |
//! | `layer` | [`MixtralWeights`] and the layer's graph ([`mixtral_layer`], [`add_layer`]) |
//! | `layer_file` | one layer from a safetensors file ([`load_layer`], [`load_hf_layer`]) |
//! | `model` | N layers chained, with embedding and LM head ([`model_graph`], [`ModelSizes`]) |
//! | `checkpoint` | a model folder: config.json + (sharded) safetensors ([`Checkpoint`]) |
//! | `checkpoint_save` | writing one ([`save_checkpoint`]); small test models ([`make_test_model`]) |
//! | `hf_config` | transformers' `config.json` ([`HfConfig`]) |

pub mod checkpoint;
pub mod checkpoint_save;
mod config;
pub mod decode;
mod hf_config;
mod layer;
mod layer_file;
pub mod model;

pub use checkpoint::Checkpoint;
pub use checkpoint_save::{
    SaveOptions, make_test_model, random_model, save_checkpoint, test_model_sizes,
};
pub use config::{MixtralConfig, WorkloadFile};
pub use hf_config::HfConfig;
pub use layer::{
    LayerNames, LayerOutputs, MixtralWeights, OUTPUT, SHORT_NAMES, add_layer, mixtral_layer,
    mixtral_layer_within, model_param_names, output_as_btd, weight_names,
};
pub use layer_file::{LoadedLayer, load_hf_layer, load_layer, load_layer_at};
pub use model::{ModelSizes, ModelWeights, model_graph};
