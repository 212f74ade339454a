"""R's ``t.test`` (package stats) on two textbook data sets, transcribed: the data and the numbers R prints. The
reference of tests/test_study_stats.py for ``tokenmix.stats`` (Welch and paired tests, their df, p and 95 % CI).

- ``SLEEP``: R's ``datasets::sleep`` (Cushny & Peebles 1905, as given by Student 1908): extra hours of sleep of 10
  patients under two drugs (``group`` 1, 2; ``ID`` 1..10 in the same order in both groups). Output of the example
  of R's ``?t.test``: ``t.test(extra ~ group, data = sleep)`` (Welch) and, pairing by ``ID``,
  ``t.test(sleep$extra[1:10], sleep$extra[11:20], paired = TRUE)``.
- ``MTCARS``: R's ``datasets::mtcars`` (Henderson & Velleman 1981, from Motor Trend 1974): ``mpg`` of the 32 cars,
  by transmission ``am`` (0 automatic: 19 cars, 1 manual: 13), in the data set's row order. Output of
  ``t.test(mpg ~ am, data = mtcars)`` as printed in the RPubs note
  https://rstudio-pubs-static.s3.amazonaws.com/1153739_a5fe0fd14dbd4ee1b282076152a7d495.html (the same figures
  in any R >= 3).

R prints t, df and the CI ends to 4-8 significant digits and p to 4: the tests compare to that precision. The
ties of ``SLEEP`` (0.8 and -0.1 occur in both groups) exercise the probability of improvement's ½ P(X = Y).
Nothing here imports the project.
"""

SLEEP_GROUP1 = (0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0)
SLEEP_GROUP2 = (1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4)

# t.test(extra ~ group, data = sleep): Welch Two Sample t-test
SLEEP_WELCH = {"t": -1.8608, "df": 17.776, "p": 0.07939, "ci": (-3.3654832, 0.2054832),
               "means": (0.75, 2.33)}
# t.test(sleep$extra[1:10], sleep$extra[11:20], paired = TRUE): Paired t-test
SLEEP_PAIRED = {"t": -4.0621, "df": 9, "p": 0.002833, "ci": (-2.4598858, -0.7001142), "mean_difference": -1.58}

MTCARS_MPG = (21.0, 21.0, 22.8, 21.4, 18.7, 18.1, 14.3, 24.4, 22.8, 19.2, 17.8, 16.4, 17.3, 15.2, 10.4, 10.4,
              14.7, 32.4, 30.4, 33.9, 21.5, 15.5, 15.2, 13.3, 19.2, 27.3, 26.0, 30.4, 15.8, 19.7, 15.0, 21.4)
MTCARS_AM = (1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1)

# t.test(mpg ~ am, data = mtcars): Welch Two Sample t-test (group 0 minus group 1)
MTCARS_WELCH = {"t": -3.7671, "df": 18.332, "p": 0.001374, "ci": (-11.280194, -3.209684),
                "means": (17.14737, 24.39231)}
