"""numpyro_sgd: scalable stochastic-gradient samplers for NumPyro models."""

from .base import SGAlgorithm, SGKernel, SGState, StepInfo
from .constant_sgd import ConstantSGD, ConstantSGDState
from .diagnostics import fit_gaussian, gaussian_kl
from .potential import MinibatchOracle, PlateInfo, SubsampledPotential
from .theory import lyapunov_covariance

# TEMP(refactor in progress): modules not yet converted are skipped; removed before commit
try:
    from .ewsg import EWSG, EWSGVR, EWSGState, EWSGVRState, OverdampedEWSG, OverdampedEWSGState
except ImportError as e:  # pragma: no cover
    print("TEMP skip ewsg", e)
try:
    from .iasg import IASG, IASGState
except ImportError as e:  # pragma: no cover
    print("TEMP skip iasg", e)
try:
    from .santa import Santa, SantaState, map_estimate, polynomial_annealing, santa
except ImportError as e:  # pragma: no cover
    print("TEMP skip santa", e)
try:
    from .sgfs import SGFS, SGFSState
except ImportError as e:  # pragma: no cover
    print("TEMP skip sgfs", e)
try:
    from .sghmc import SGHMC, SGHMCState
except ImportError as e:  # pragma: no cover
    print("TEMP skip sghmc", e)
try:
    from .sgld import PSGLD, SGLD, PSGLDState, SGLDState, robbins_monro
except ImportError as e:  # pragma: no cover
    print("TEMP skip sgld", e)
try:
    from .vem import VariationalEM, VariationalEMState
except ImportError as e:  # pragma: no cover
    print("TEMP skip vem", e)

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
