-- Run once by the postgres image on an empty volume: the trainer's database beside the labels party's.
CREATE DATABASE trainer OWNER labeldp;
