//! The parts of Karpenter core that kpssh provides itself (DESIGN §2, "karpenter layer").

pub mod quantity;
