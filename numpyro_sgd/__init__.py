"""numpyro_sgd: scalable stochastic-gradient samplers for NumPyro models."""

from .base import SGKernel, SGState
from .constant_sgd import ConstantSGD, ConstantSGDState
from .diagnostics import fit_gaussian, gaussian_kl
from .ewsg import EWSG, EWSGVR, EWSGState, EWSGVRState, OverdampedEWSG, OverdampedEWSGState
from .iasg import IASG, IASGState
from .potential import PlateInfo, SubsampledPotential
from .santa import Santa, SantaState, map_estimate, polynomial_annealing, santa
from .sgfs import SGFS, SGFSState
from .sghmc import SGHMC, SGHMCState
from .sgld import PSGLD, SGLD, PSGLDState, SGLDState, robbins_monro
from .theory import lyapunov_covariance
from .vem import VariationalEM, VariationalEMState

__version__ = "0.1.0"

__all__ = [
    "ConstantSGD",
    "ConstantSGDState",
    "EWSG",
    "EWSGState",
    "EWSGVR",
    "EWSGVRState",
    "OverdampedEWSG",
    "OverdampedEWSGState",
    "IASG",
    "IASGState",
    "PlateInfo",
    "PSGLD",
    "PSGLDState",
    "SGFS",
    "Santa",
    "SantaState",
    "map_estimate",
    "polynomial_annealing",
    "santa",
    "SGFSState",
    "SGHMC",
    "SGHMCState",
    "SGKernel",
    "SGLD",
    "SGLDState",
    "SGState",
    "SubsampledPotential",
    "VariationalEM",
    "VariationalEMState",
    "fit_gaussian",
    "gaussian_kl",
    "lyapunov_covariance",
    "robbins_monro",
]
