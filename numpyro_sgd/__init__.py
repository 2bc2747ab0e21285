"""numpyro_sgd: scalable stochastic-gradient samplers for NumPyro models."""

from .base import SampleBlock, SGAlgorithm, SGKernel, SGState, StepInfo
from .constant_sgd import ConstantSGD, ConstantSGDState, constant_sgd
from .diagnostics import (
    check_run,
    compare,
    convergence_curve,
    fit_gaussian,
    gaussian_kl,
    moment_errors,
    plot_convergence,
    plot_ellipses,
    plot_marginals,
    to_arviz,
)
from .ewsg import (
    EWSG,
    EWSGVR,
    EWSGState,
    EWSGVRState,
    OverdampedEWSG,
    OverdampedEWSGState,
    ewsg,
    ewsg_vr,
    overdamped_ewsg,
)
from .gibbs import SGWithinGibbs, SGWithinGibbsState, centre_loc_scale, hyper_candidates, sg_within_gibbs
from .iasg import IASG, IASGState, iasg
from .loo import LooSubsample, compare_loo, loo_subsample
from .potential import MinibatchOracle, PlateInfo, SubsampledPotential
from .santa import Santa, SantaKernelState, SantaState, map_estimate, santa, santa_algorithm
from .schedules import polynomial_annealing, robbins_monro
from .sgfs import SGFS, SGFSState, sgfs
from .sghmc import SGHMC, SGHMCState, sghmc
from .sgld import PSGLD, SGLD, PSGLDState, SGLDState, psgld, sgld
from .streaming import StreamedRows, open_shards, stream
from .theory import lyapunov_covariance
from .vem import VariationalEM, VariationalEMState, variational_em
from .wrapper import SGWrapper

__version__ = "0.1.0"

__all__ = [
    "StreamedRows",
    "open_shards",
    "stream",
    "check_run",
    "centre_loc_scale",
    "hyper_candidates",
    "sg_within_gibbs",
    "ConstantSGD",
    "ConstantSGDState",
    "EWSG",
    "EWSGState",
    "EWSGVR",
    "EWSGVRState",
    "IASG",
    "IASGState",
    "LooSubsample",
    "MinibatchOracle",
    "OverdampedEWSG",
    "OverdampedEWSGState",
    "PlateInfo",
    "PSGLD",
    "PSGLDState",
    "SGAlgorithm",
    "SampleBlock",
    "SGFS",
    "SGFSState",
    "SGHMC",
    "SGHMCState",
    "SGKernel",
    "SGWrapper",
    "SGLD",
    "SGLDState",
    "SGState",
    "SGWithinGibbs",
    "SGWithinGibbsState",
    "Santa",
    "SantaState",
    "SantaKernelState",
    "StepInfo",
    "SubsampledPotential",
    "VariationalEM",
    "VariationalEMState",
    "compare",
    "compare_loo",
    "convergence_curve",
    "constant_sgd",
    "ewsg",
    "ewsg_vr",
    "fit_gaussian",
    "gaussian_kl",
    "iasg",
    "loo_subsample",
    "lyapunov_covariance",
    "moment_errors",
    "overdamped_ewsg",
    "plot_convergence",
    "plot_ellipses",
    "plot_marginals",
    "map_estimate",
    "polynomial_annealing",
    "psgld",
    "robbins_monro",
    "santa",
    "santa_algorithm",
    "sgfs",
    "sghmc",
    "sgld",
    "to_arviz",
    "variational_em",
]
