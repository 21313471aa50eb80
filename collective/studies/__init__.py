"""Studies over many episodes: the scale study (:mod:`.study`), a world's health check
(:mod:`.check`) and the statistics findings are judged by (:mod:`.intervals`)."""

from collective.studies.check import check_world as check_world
from collective.studies.study import ScaleConfig as ScaleConfig
from collective.studies.study import scale_study as scale_study
