"""numpyro_sgd: scalable stochastic-gradient samplers for NumPyro models."""

from .data.streaming import StreamedRows, open_shards, stream
from .diagnostics.arviz_export import to_arviz
from .diagnostics.compare import compare, convergence_curve, fit_gaussian, gaussian_kl, moment_errors
from .diagnostics.loo import LooSubsample, loo_subsample
from .diagnostics.model_comparison import compare_loo
from .diagnostics.plots import plot_convergence, plot_ellipses, plot_marginals
from .diagnostics.run_checks import check_run
from .driver.kernel import SGKernel
from .driver.wrapper import SGWrapper
from .kernels.constant_sgd import ConstantSGD, ConstantSGDState, constant_sgd
from .kernels.ewsg import (
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
from .kernels.gibbs import SGWithinGibbs, SGWithinGibbsState, sg_within_gibbs
from .kernels.iasg import IASG, IASGState, iasg
from .kernels.santa import Santa, SantaKernelState, SantaState, map_estimate, santa, santa_algorithm
from .kernels.sgfs import SGFS, SGFSState, sgfs
from .kernels.sghmc import SGHMC, SGHMCState, sghmc
from .kernels.sgld import PSGLD, SGLD, PSGLDState, SGLDState, psgld, sgld
from .kernels.vem import VariationalEM, VariationalEMState, variational_em
from .model.discovery import PlateInfo
from .model.oracle import MinibatchOracle
from .model.potential import SubsampledPotential
from .model.structure import centre_loc_scale, hyper_candidates
from .numerics.schedules import polynomial_annealing, robbins_monro
from .numerics.theory import lyapunov_covariance
from .protocol import SampleBlock, SGAlgorithm, SGState, StepInfo

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
